package pgcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The TLS files, relative to the data directory (which is where the server
// looks for relative ssl_* paths).
const (
	caCertFile     = "ca.crt"
	serverCertFile = "server.crt"
	serverKeyFile  = "server.key"
)

// tlsValidity is how long the certificates last. A `baton dev` cluster
// keeps its files across restarts, so they must outlive it.
const tlsValidity = 10 * 365 * 24 * time.Hour

// CAFile returns the path of the PEM certificate of the authority that
// signed the server's certificate, for a client's sslrootcert, or "" when
// Options.TLS is off. The file sits in the data directory, which only the
// server user (and root) can read.
func (c *Cluster) CAFile() string {
	if !c.opts.TLS {
		return ""
	}
	return filepath.Join(c.opts.Dir, caCertFile)
}

// TLSURL returns a URL for database db as user (with password unless it is
// empty) over TLS with sslmode=verify-full: the client checks that the
// server's certificate is signed by CAFile and names 127.0.0.1. It needs
// Options.TLS and a pg_hba.conf line that admits the user (see
// Options.HBA).
func (c *Cluster) TLSURL(user, password, db string) string {
	u := &url.URL{
		Scheme: "postgres",
		User:   url.User(user),
		Host:   net.JoinHostPort("127.0.0.1", strconv.Itoa(c.opts.Port)),
		Path:   "/" + db,
	}
	if password != "" {
		u.User = url.UserPassword(user, password)
	}
	q := url.Values{}
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", c.CAFile())
	u.RawQuery = q.Encode()
	return u.String()
}

// ensureTLS makes the certificate authority, the server's certificate and
// its key, unless all three exist already (a restart, or a standby that
// pg_basebackup copied them to).
func (c *Cluster) ensureTLS() error {
	caPath := filepath.Join(c.opts.Dir, caCertFile)
	certPath := filepath.Join(c.opts.Dir, serverCertFile)
	keyPath := filepath.Join(c.opts.Dir, serverKeyFile)
	missing := false
	for _, p := range []string{caPath, certPath, keyPath} {
		if _, err := os.Stat(p); err != nil {
			missing = true
		}
	}
	if !missing {
		return nil
	}
	caPEM, certPEM, keyPEM, err := makeServerCert(time.Now())
	if err != nil {
		return fmt.Errorf("pgcluster: make the TLS certificates: %w", err)
	}
	// PostgreSQL refuses a key that others can read.
	if err := c.writeFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	if err := c.writeFile(certPath, certPEM, 0o644); err != nil {
		return err
	}
	return c.writeFile(caPath, caPEM, 0o644)
}

// makeServerCert returns a new certificate authority and a server
// certificate it signed for 127.0.0.1, ::1 and localhost, with the
// server's private key, all PEM-encoded. The authority's key is not kept:
// nothing else is ever signed with it.
func makeServerCert(now time.Time) (caPEM, certPEM, keyPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	caSerial, err := serialNumber()
	if err != nil {
		return nil, nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: "Baton pgcluster CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(tlsValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(tlsValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
