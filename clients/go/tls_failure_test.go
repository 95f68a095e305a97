package agio_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
)

// serveHealth serves the health service on 127.0.0.1 with the options (plaintext without
// any); its address.
func serveHealth(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	server := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(server, health.NewServer())
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return listener.Addr().String()
}

// healthError is the *agio.Error of a health check by a client dialed with config (nil:
// plaintext).
func healthError(t *testing.T, address string, config *agio.TLSConfig) *agio.Error {
	t.Helper()
	var opts []grpc.DialOption
	if config != nil {
		creds, err := config.Credentials()
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	}
	client, err := agio.Dial(address, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = client.Health(ctx)
	var decoded *agio.Error
	if !errors.As(err, &decoded) {
		t.Fatalf("want an *agio.Error, got %v", err)
	}
	return decoded
}

func TestATLSMistakeOfTheClientSaysWhatToChange(t *testing.T) {
	dir := t.TempDir()
	ca, stranger := newCA(t), newCA(t)
	serverCert := ca.issue(t, "localhost", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	caFile := writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.der)
	strangerFile := writePEM(t, dir, "stranger.pem", "CERTIFICATE", stranger.der)
	tlsServer := serveHealth(t, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}})))
	mutualServer := serveHealth(t, grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientCAs:    ca.pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
	})))
	plaintextServer := serveHealth(t)

	cases := []struct {
		name    string
		address string
		config  *agio.TLSConfig
		// One of these: a mutual TLS server's refusal reaches the client as a TLS alert or
		// as a closed connection, whichever the client reads first.
		want  []agio.TLSFailure
		names string
	}{
		{"plaintext client of a TLS server", tlsServer, nil, []agio.TLSFailure{agio.ConnectionClosed}, "AGIO_CA_FILE"},
		{"a CA that did not sign the server's certificate", tlsServer, &agio.TLSConfig{CAFile: strangerFile}, []agio.TLSFailure{agio.UntrustedCertificate}, "TLSConfig.CAFile"},
		{"no client certificate for mutual TLS", mutualServer, &agio.TLSConfig{CAFile: caFile}, []agio.TLSFailure{agio.HandshakeRefused, agio.ConnectionClosed}, "TLSConfig.CertFile"},
		{"TLS client of a plaintext server", plaintextServer, &agio.TLSConfig{CAFile: caFile}, []agio.TLSFailure{agio.ServerWithoutTLS}, "leave out -tls, -ca-file and AGIO_CA_FILE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := healthError(t, c.address, c.config)
			if !slices.Contains(c.want, err.TLSFailure) {
				t.Fatalf("TLSFailure %v, want one of %v: %v", err.TLSFailure, c.want, err)
			}
			said := err.Error()
			if !strings.HasSuffix(said, ")") || !strings.Contains(said, "("+err.TLSFailure.String()+": ") || !strings.Contains(said, c.names) {
				t.Fatalf("the message does not say what to change: %v", err)
			}
		})
	}
}

func TestAnAddressNobodyListensOnIsNoTLSFailure(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := listener.Addr().String()
	_ = listener.Close()
	if failure := healthError(t, address, nil).TLSFailure; failure != agio.NoTLSFailure {
		t.Fatalf("TLSFailure %v for a refused connection", failure)
	}
}
