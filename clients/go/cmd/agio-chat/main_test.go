package main

import (
	"path/filepath"
	"strings"
	"testing"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
)

func TestAddressDefaultsToAgioAddress(t *testing.T) {
	t.Setenv("AGIO_ADDRESS", "agio.internal:7000")
	if got := serverAddress(); got != "agio.internal:7000" {
		t.Fatalf("serverAddress() = %q with AGIO_ADDRESS set", got)
	}
}

func TestAddressFallsBackToTheDefaultListenAddress(t *testing.T) {
	t.Setenv("AGIO_ADDRESS", "")
	if got := serverAddress(); got != "127.0.0.1:50051" {
		t.Fatalf("serverAddress() = %q without AGIO_ADDRESS", got)
	}
}

func TestPlaintextWithoutTLSOptions(t *testing.T) {
	opts, err := connection{}.dialOptions()
	if err != nil || len(opts) != 0 {
		t.Fatalf("dialOptions() = %d options, %v; want none (agio.Dial's plaintext)", len(opts), err)
	}
}

func TestTLSOptionsNeedFilesThatCanBeRead(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "ca.pem")
	_, err := connection{files: agio.TLSConfig{CAFile: missing}}.dialOptions()
	if err == nil || !strings.Contains(err.Error(), "cannot read the CA file") {
		t.Fatalf("dialOptions() with a missing CA file: %v", err)
	}
	opts, err := connection{tls: true, token: "t"}.dialOptions()
	if err != nil || len(opts) != 2 {
		t.Fatalf("-tls -token: %d options, %v", len(opts), err)
	}
}
