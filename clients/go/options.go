package baton

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"time"
)

// Defaults of the settings, as the command line has them.
const (
	TimeoutDefault     = 10 * time.Second
	DialTimeoutDefault = time.Second
)

// settings are a client's, from its options or else the command line's
// environment variables (BATON_SERVER, BATON_TLS_CA, BATON_CLIENT_CERT,
// BATON_CLIENT_KEY, BATON_TOKEN_FILE, BATON_TIMEOUT, BATON_DIAL_TIMEOUT,
// BATON_HOLDER).
type settings struct {
	caFile, certFile, keyFile, tokenFile string
	timeout, dialTimeout                 time.Duration
	holder                               string
	set                                  map[string]bool
}

// Option sets one setting of [New].
type Option func(*settings)

// WithTLS connects over TLS, trusting caFile (PEM); certFile and keyFile,
// both or neither, are a client certificate.
func WithTLS(caFile, certFile, keyFile string) Option {
	return func(s *settings) {
		s.caFile, s.certFile, s.keyFile = caFile, certFile, keyFile
		s.set["tls"] = true
	}
}

// WithTokenFile sends the bearer token in path with every call.
func WithTokenFile(path string) Option {
	return func(s *settings) { s.tokenFile = path; s.set["token"] = true }
}

// WithTimeout bounds every call beyond its server-side wait.
func WithTimeout(d time.Duration) Option {
	return func(s *settings) { s.timeout = d; s.set["timeout"] = true }
}

// WithDialTimeout bounds a dial: a server that has not completed gRPC's
// handshake by then is passed over for the next.
func WithDialTimeout(d time.Duration) Option {
	return func(s *settings) { s.dialTimeout = d; s.set["dial"] = true }
}

// WithHolder describes who holds the leases this client acquires.
func WithHolder(holder string) Option {
	return func(s *settings) { s.holder = holder; s.set["holder"] = true }
}

func env(name string) string { return strings.TrimSpace(os.Getenv(name)) }

// resolve fills what no option set from the environment, and checks it.
func (s *settings) resolve() error {
	if !s.set["tls"] {
		s.caFile, s.certFile, s.keyFile = env("BATON_TLS_CA"), env("BATON_CLIENT_CERT"), env("BATON_CLIENT_KEY")
	}
	if !s.set["token"] {
		s.tokenFile = env("BATON_TOKEN_FILE")
	}
	for _, d := range []struct {
		set   string
		name  string
		value *time.Duration
		def   time.Duration
	}{
		{"timeout", "BATON_TIMEOUT", &s.timeout, TimeoutDefault},
		{"dial", "BATON_DIAL_TIMEOUT", &s.dialTimeout, DialTimeoutDefault},
	} {
		if s.set[d.set] {
			if *d.value <= 0 {
				return invalidf("%s %v: it must be above 0", strings.ToLower(d.name[6:]), *d.value)
			}
			continue
		}
		*d.value = d.def
		if raw := env(d.name); raw != "" {
			v, err := parseDuration(raw)
			if err != nil || v <= 0 {
				return invalidf("%s=%q: write a duration above 0, like 10s or 500ms", d.name, raw)
			}
			*d.value = v
		}
	}
	if !s.set["holder"] {
		s.holder = env("BATON_HOLDER")
	}
	if s.holder != "" {
		if _, err := CheckHolder(s.holder); err != nil {
			return err
		}
	}
	if (s.certFile == "") != (s.keyFile == "") {
		return invalidf("a client certificate needs both a certificate and a key file")
	}
	if s.certFile != "" && s.caFile == "" {
		return invalidf("a client certificate needs TLS: give the CA file too")
	}
	return nil
}

// tlsConfig is the TLS of the settings, nil without a CA file.
func (s *settings) tlsConfig() (*tls.Config, error) {
	if s.caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(s.caFile)
	if err != nil {
		return nil, invalidf("TLS CA file: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, invalidf("TLS CA file %s holds no PEM certificate", s.caFile)
	}
	config := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if s.certFile != "" {
		pair, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return nil, invalidf("client certificate: %v", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config, nil
}

// token is the bearer token of the settings, "" without a token file.
func (s *settings) token() (string, error) {
	if s.tokenFile == "" {
		return "", nil
	}
	raw, err := os.ReadFile(s.tokenFile)
	if err != nil {
		return "", invalidf("token file: %v", err)
	}
	token := strings.TrimSpace(string(raw))
	if token == "" {
		return "", invalidf("token file %s is empty", s.tokenFile)
	}
	return token, nil
}

// parseDuration reads a duration as the command line's variables hold it
// (10s, 500ms, 1m30s): a unit on every number, no fraction, no sign, a
// whole number of milliseconds.
func parseDuration(raw string) (time.Duration, error) {
	if allDigits(raw) || strings.ContainsAny(raw, ".-+") {
		return 0, invalidf("%q: write a duration with units, like 10s", raw)
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d%time.Millisecond != 0 || d > DurationMax {
		return 0, invalidf("%q: write a whole number of milliseconds, at most 365 days, like 10s", raw)
	}
	return d, nil
}
