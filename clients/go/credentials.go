package agio

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TLSConfig says how to reach a server over TLS. The zero value trusts the system's roots
// and presents no client certificate.
//
//	creds, err := agio.TLSConfig{CAFile: "ca.pem"}.Credentials()
//	client, err := agio.Dial("agio.internal:50051", grpc.WithTransportCredentials(creds),
//		agio.WithToken(os.Getenv("AGIO_TOKEN")))
type TLSConfig struct {
	// CAFile holds the PEM certificates of the CAs that signed the server's certificate;
	// empty: the system's roots.
	CAFile string
	// CertFile is the client's PEM certificate chain, for a server that asks for one
	// (mutual TLS); KeyFile is its PEM private key. Both or neither.
	CertFile string
	KeyFile  string
}

// Credentials reads the files into transport credentials for grpc.WithTransportCredentials.
func (c TLSConfig) Credentials() (credentials.TransportCredentials, error) {
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read the CA file: %w", err)
		}
		config.RootCAs = x509.NewCertPool()
		if !config.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the CA file %s holds no PEM certificate", c.CAFile)
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("a client certificate goes with its key: give both or neither")
	}
	if c.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cannot load the client certificate: %w", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(config), nil
}

// WithToken sends token as `authorization: Bearer <token>` with every call, over TLS or
// plaintext (a server behind a TLS-terminating proxy, or on the same machine).
func WithToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(bearerToken(token))
}

type bearerToken string

func (t bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return false }

// String keeps the token out of logs that print dial options.
func (bearerToken) String() string { return "bearerToken(…)" }
