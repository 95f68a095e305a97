package agio_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
)

// A health server over mutual TLS that records each call's authorization header.
func TestTLSAndTokenReachAMutualTLSServer(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t)
	serverCert := ca.issue(t, "localhost", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	clientCert := ca.issue(t, "agio test client", x509.ExtKeyUsageClientAuth, nil)
	caFile := writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.der)
	certFile := writePEM(t, dir, "client.pem", "CERTIFICATE", clientCert.Certificate[0])
	keyDER, err := x509.MarshalPKCS8PrivateKey(clientCert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := writePEM(t, dir, "client.key", "PRIVATE KEY", keyDER)

	seen := make(chan string, 4)
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		seen <- strings.Join(md.Get("authorization"), ",")
		return next(ctx, req)
	}
	server := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{serverCert},
			ClientCAs:    ca.pool(),
			ClientAuth:   tls.RequireAndVerifyClientCert,
		})),
		grpc.UnaryInterceptor(record),
	)
	healthpb.RegisterHealthServer(server, health.NewServer())
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	address := listener.Addr().String()

	check := func(config agio.TLSConfig, opts ...grpc.DialOption) error {
		creds, err := config.Credentials()
		if err != nil {
			t.Fatal(err)
		}
		client, err := agio.Dial(address, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = client.Health(ctx)
		return err
	}

	if err := check(agio.TLSConfig{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}, agio.WithToken("s3cret")); err != nil {
		t.Fatalf("with the client certificate: %v", err)
	}
	if got := <-seen; got != "Bearer s3cret" {
		t.Fatalf("authorization %q", got)
	}
	if err := check(agio.TLSConfig{CAFile: caFile}); err == nil {
		t.Fatal("a client without a certificate got in")
	}
	plain, err := agio.Dial(address)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := plain.Health(ctx); err == nil {
		t.Fatal("a plaintext client got in")
	}
}

func TestTLSConfigRefusesFilesItCannotUse(t *testing.T) {
	dir := t.TempDir()
	if _, err := (agio.TLSConfig{CAFile: filepath.Join(dir, "missing.pem")}).Credentials(); err == nil ||
		!strings.Contains(err.Error(), "cannot read the CA file") {
		t.Fatalf("a missing CA file: %v", err)
	}
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (agio.TLSConfig{CAFile: notPEM}).Credentials(); err == nil ||
		!strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Fatalf("a CA file without certificates: %v", err)
	}
	if _, err := (agio.TLSConfig{CertFile: notPEM}).Credentials(); err == nil ||
		!strings.Contains(err.Error(), "goes with its key") {
		t.Fatalf("a certificate without its key: %v", err)
	}
}

type testCA struct {
	key *ecdsa.PrivateKey
	der []byte
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "agio test CA"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{key: key, der: der}
}

func (ca *testCA) pool() *x509.CertPool {
	certificate, _ := x509.ParseCertificate(ca.der)
	pool := x509.NewCertPool()
	pool.AddCert(certificate)
	return pool
}

func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage, ips []net.IP) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	parent, err := x509.ParseCertificate(ca.der)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func writePEM(t *testing.T, dir, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
