package main

import "testing"

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
