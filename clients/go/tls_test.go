package baton

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/clients/go/batontest"
)

// issued writes a key and a certificate for cn, signed by ca (self-signed
// when ca is nil), and returns them with the paths written.
func issued(t *testing.T, dir, name, cn string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	if isCA {
		template.IsCA, template.BasicConstraintsValid = true, true
		template.IPAddresses, template.DNSNames, template.ExtKeyUsage = nil, nil, nil
	}
	parent, signer := template, key
	if ca != nil {
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, template, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(path, kind string, bytes []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: bytes}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	write(filepath.Join(dir, name+".key"), "PRIVATE KEY", keyDER)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// A server with TLS, client certificates of its CA and an auth file: the
// client with the CA, a certificate and a worker's token is let in; the
// same without the token acts as the certificate's principal, whose
// rules refuse a lease; a wrong token is unauthenticated.
func TestTLSWithAClientCertificateAndAToken(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ca, caKey := issued(t, dir, "ca", "baton test CA", nil, nil, true)
	issued(t, dir, "server", "localhost", ca, caKey, false)
	issued(t, dir, "client", "ops", ca, caKey, false)
	token := "go-worker-token-0123456789abcdef"
	digest := sha256.Sum256([]byte(token))
	auth := filepath.Join(dir, "auth.toml")
	if err := os.WriteFile(auth, []byte(`[[principal]]
name = "worker"
token_sha256 = "`+hex.EncodeToString(digest[:])+`"
rules = { "job:" = ["read", "lease"] }

[[principal]]
name = "ops"
rules = { "" = ["read"] }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "worker.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(dir, "wrong.token")
	if err := os.WriteFile(wrong, []byte("not-a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := batontest.Start(t, "--data-dir", filepath.Join(dir, "data"),
		"--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server.key"),
		"--tls-client-ca", filepath.Join(dir, "ca.pem"), "--auth-file", auth, "--require-auth")
	tlsFiles := WithTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key"))

	worker := connect(t, n.Addr, tlsFiles, WithTokenFile(tokenFile))
	lease, err := worker.Acquire(ctx, "job:tls", WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("the worker, over TLS with its token: %v", err)
	}
	ops := connect(t, n.Addr, tlsFiles)
	if st, err := ops.Status(ctx, "job:tls"); err != nil || st.HolderToken != lease.Token {
		t.Fatalf("ops, by its certificate, reads: %+v, %v", st, err)
	}
	if _, err := ops.Acquire(ctx, "job:other"); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("ops may not lease: %v", err)
	}
	stranger := connect(t, n.Addr, tlsFiles, WithTokenFile(wrong))
	if _, err := stranger.Status(ctx, "job:tls"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("an unknown token: %v", err)
	}
	// Plain text to the TLS port: the server answers that it requires TLS.
	plain := connect(t, n.Addr, WithTokenFile(tokenFile))
	_, err = plain.Status(ctx, "job:tls")
	if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "this port requires TLS") {
		t.Fatalf("plaintext to a TLS port: %v", err)
	}
}
