package pgserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// CA is a certificate authority made at run time, for a server with Options.TLS and for the test
// that plays a TLS interceptor with a certificate of its own. Nothing is written to disk but
// what the server needs.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// NewCA makes a CA named name, valid for a day.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// PEM returns the CA's certificate.
func (ca *CA) PEM() []byte { return ca.pem }

// Pool returns a pool holding the CA's certificate alone, for tls.Config.RootCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue makes a server certificate for hosts (IP addresses or DNS names), signed by the CA, and
// returns it and its key in PEM.
func (ca *CA) Issue(hosts ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// Certificate is Issue as a tls.Certificate, for a server written in Go (an interceptor).
func (ca *CA) Certificate(hosts ...string) (tls.Certificate, error) {
	c, k, err := ca.Issue(hosts...)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(c, k)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// setupTLS gives the server in dir a certificate for 127.0.0.1 and localhost signed by a new CA,
// and, with hostSSLOnly, a pg_hba.conf that accepts TCP clients over TLS with SCRAM alone. It
// returns the CA, its file (for sslrootcert) and the server settings that turn TLS on.
func setupTLS(run runAs, dir string, hostSSLOnly bool) (*CA, string, []string, error) {
	ca, err := NewCA("pgxlanes test CA")
	if err != nil {
		return nil, "", nil, err
	}
	certPEM, keyPEM, err := ca.Issue("127.0.0.1", "localhost")
	if err != nil {
		return nil, "", nil, err
	}
	data := filepath.Join(dir, "data")
	files := []struct {
		name string
		b    []byte
	}{{"server.crt", certPEM}, {"server.key", keyPEM}}
	for _, f := range files {
		p := filepath.Join(data, f.name)
		if err := os.WriteFile(p, f.b, 0o600); err != nil {
			return nil, "", nil, err
		}
		if err := run.chown(p); err != nil {
			return nil, "", nil, err
		}
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM(), 0o644); err != nil {
		return nil, "", nil, err
	}
	if hostSSLOnly {
		hba := "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n"
		p := filepath.Join(data, "pg_hba.conf")
		if err := os.WriteFile(p, []byte(hba), 0o600); err != nil {
			return nil, "", nil, err
		}
		if err := run.chown(p); err != nil {
			return nil, "", nil, err
		}
	}
	return ca, caFile, []string{"-c", "ssl=on", "-c", "ssl_cert_file=server.crt", "-c", "ssl_key_file=server.key"}, nil
}

// CA returns the CA that signed the server's certificate, or nil for a server without
// Options.TLS.
func (s *Server) CA() *CA {
	if s.local == nil {
		return nil
	}
	return s.local.ca
}

// TokenRole is a login role without a password of its own, as a cloud database's IAM or Azure AD
// login is: each Next gives it a new random password and returns it, and the password before it
// stops working. A client must fetch a token for every session it opens, as
// pgxpool.Config.BeforeConnect does.
type TokenRole struct {
	s    *Server
	name string

	mu     sync.Mutex // serializes Next
	issued int
}

// NewTokenRole creates the login role name with no usable password, allowed to connect to every
// database and to use the schema public.
func (s *Server) NewTokenRole(ctx context.Context, name string) (*TokenRole, error) {
	id := pgx.Identifier{name}.Sanitize()
	if err := s.exec(ctx, "create role "+id+" login password null"); err != nil {
		return nil, fmt.Errorf("harness: create role %s: %w", name, err)
	}
	if err := s.exec(ctx, "grant all on schema public to "+id); err != nil {
		return nil, fmt.Errorf("harness: grant to %s: %w", name, err)
	}
	return &TokenRole{s: s, name: name}, nil
}

// Name is the role's name.
func (t *TokenRole) Name() string { return t.name }

// Issued is how many tokens Next has issued.
func (t *TokenRole) Issued() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.issued
}

// Next issues a new token: the role's password from now on.
func (t *TokenRole) Next(ctx context.Context) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok := "tok-" + randomHex(16)
	// The token is random hex: safe to write into the statement.
	if err := t.s.exec(ctx, "alter role "+pgx.Identifier{t.name}.Sanitize()+" password '"+tok+"'"); err != nil {
		return "", errors.New("harness: issuing a token failed")
	}
	t.issued++
	return tok, nil
}
