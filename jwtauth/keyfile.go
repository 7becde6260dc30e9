package jwtauth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxKeyFile bounds what is read from a key file: a PEM Ed25519 key is
// about a hundred bytes, never megabytes.
const maxKeyFile = 64 << 10

// ErrKeyFileExists is the error of CreateKeyPair for a file that is
// there already: a key pair is never replaced by accident, since every
// agent that trusts the old key refuses the tokens of a new one until the
// API serves it.
var ErrKeyFileExists = errors.New("exists already")

// makeOne says how to make a key that Baton takes.
const makeOne = "make a key pair with `baton agent-key create`, or a private key with `openssl genpkey -algorithm ed25519`"

// keyFile is what a key file holds: an Ed25519 private key (PKCS #8) or
// public key (PKIX), in PEM.
type keyFile struct {
	private ed25519.PrivateKey
	public  ed25519.PublicKey
}

// readKeyFile reads and parses the PEM key file at path. A private key
// must be closed to other users: whoever reads it can sign for Baton.
// Errors name the file and say how to fix it; none holds the file's
// content.
func readKeyFile(path string) (keyFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return keyFile{}, openError(path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return keyFile{}, openError(path, err)
	}
	if !fi.Mode().IsRegular() {
		return keyFile{}, fmt.Errorf("%s is not a regular file: give the path of a PEM key file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	defer wipe(b)
	if err != nil {
		return keyFile{}, openError(path, err)
	}
	if len(b) > maxKeyFile {
		return keyFile{}, fmt.Errorf("%s is over %d bytes: a key file holds one PEM key; %s", path, maxKeyFile, makeOne)
	}
	k, err := parseKeyPEM(path, b)
	if err != nil {
		return keyFile{}, err
	}
	if k.private != nil {
		// Group access is allowed: systemd credentials and Kubernetes
		// Secrets (defaultMode 0440) hand a file to a service's group.
		if perm := fi.Mode().Perm(); perm&0o007 != 0 {
			return keyFile{}, fmt.Errorf("%s holds a private key that every user of this machine may access (mode %04o): anyone who reads it can sign as Baton; chmod 600 %s (for a Kubernetes Secret, set defaultMode: 0400)", path, perm, path)
		}
	}
	return k, nil
}

// parseKeyPEM parses the one PEM block of a key file.
func parseKeyPEM(path string, b []byte) (keyFile, error) {
	block, rest := pem.Decode(b)
	if block == nil {
		return keyFile{}, fmt.Errorf("%s is not a PEM key file (no -----BEGIN PRIVATE KEY----- or -----BEGIN PUBLIC KEY-----): %s", path, makeOne)
	}
	defer wipe(block.Bytes)
	if next, _ := pem.Decode(rest); next != nil {
		wipe(next.Bytes)
		return keyFile{}, fmt.Errorf("%s holds more than one PEM block: keep one key per file (several public keys go in several files)", path)
	}
	// Only the types named here are ever repeated in an error: the line
	// of an unknown one could be anything.
	switch block.Type {
	case "PRIVATE KEY":
		key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return keyFile{}, fmt.Errorf("%s holds a PRIVATE KEY block that is not a valid PKCS #8 key: %s", path, makeOne)
		}
		switch k := key.(type) {
		case ed25519.PrivateKey:
			return keyFile{private: k, public: k.Public().(ed25519.PublicKey)}, nil
		case *rsa.PrivateKey:
			return keyFile{}, fmt.Errorf("%s holds an RSA key: Baton signs with Ed25519 keys only; %s", path, makeOne)
		case *ecdsa.PrivateKey:
			return keyFile{}, fmt.Errorf("%s holds an ECDSA key: Baton signs with Ed25519 keys only; %s", path, makeOne)
		}
		return keyFile{}, fmt.Errorf("%s holds a key of another type than Ed25519: %s", path, makeOne)
	case "PUBLIC KEY":
		key, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return keyFile{}, fmt.Errorf("%s holds a PUBLIC KEY block that is not a valid key: %s", path, makeOne)
		}
		if k, ok := key.(ed25519.PublicKey); ok {
			// A copy: the parsed key shares the bytes that are wiped.
			return keyFile{public: append(ed25519.PublicKey(nil), k...)}, nil
		}
		return keyFile{}, fmt.Errorf("%s holds a public key of another type than Ed25519: %s", path, makeOne)
	case "ENCRYPTED PRIVATE KEY":
		return keyFile{}, fmt.Errorf("%s holds an encrypted private key: Baton reads it unencrypted, protected by the file's mode (openssl pkey -in %s -out NEW_FILE decrypts it)", path, path)
	case "RSA PRIVATE KEY", "RSA PUBLIC KEY":
		return keyFile{}, fmt.Errorf("%s holds an RSA key: Baton signs with Ed25519 keys only; %s", path, makeOne)
	case "EC PRIVATE KEY":
		return keyFile{}, fmt.Errorf("%s holds an EC key: Baton signs with Ed25519 keys only; %s", path, makeOne)
	case "OPENSSH PRIVATE KEY":
		return keyFile{}, fmt.Errorf("%s holds an OpenSSH key: Baton reads PKCS #8 PEM; %s", path, makeOne)
	case "CERTIFICATE":
		return keyFile{}, fmt.Errorf("%s holds a certificate: Baton reads a bare Ed25519 key; %s", path, makeOne)
	}
	return keyFile{}, fmt.Errorf("%s holds a PEM block that is no Ed25519 key (PRIVATE KEY or PUBLIC KEY): %s", path, makeOne)
}

// openError says why path cannot be read, without a detail that could
// come from its content.
func openError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist: give the path of a PEM key file; %s", path, makeOne)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s is not readable by this user: give the process read access to it (and only its owner or group)", path)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s cannot be read: %v", path, pe.Err)
	}
	return fmt.Errorf("%s cannot be read", path)
}

// CreateKeyPair makes a new Ed25519 key pair and writes its private key
// to privatePath (PKCS #8 PEM, mode 0600 from the first byte) and its
// public key to publicPath (PKIX PEM, mode 0644). A file that exists
// already is an error that wraps ErrKeyFileExists, and nothing is written,
// unless replace is set: then both files are replaced, each in one rename.
// The folders must exist.
func CreateKeyPair(privatePath, publicPath string, replace bool) (*SigningKey, error) {
	if sameFile(privatePath, publicPath) {
		return nil, fmt.Errorf("the private and the public key cannot go to one file (%s)", privatePath)
	}
	if !replace {
		for _, p := range []string{privatePath, publicPath} {
			if _, err := os.Lstat(p); err == nil {
				return nil, fmt.Errorf("%s %w", p, ErrKeyFileExists)
			}
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	wipe(der)
	defer wipe(privPEM)
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if replace {
		err = replaceFiles([]string{privatePath, publicPath}, [][]byte{privPEM, pubPEM}, []fs.FileMode{0o600, 0o644})
	} else {
		err = createFiles([]string{privatePath, publicPath}, [][]byte{privPEM, pubPEM}, []fs.FileMode{0o600, 0o644})
	}
	if err != nil {
		return nil, err
	}
	return newSigningKey(priv)
}

// createFiles creates each new file with its mode; O_EXCL keeps a file
// that appeared since the check. When one cannot be written, the files
// made before it are removed: they were this call's.
func createFiles(paths []string, data [][]byte, perms []fs.FileMode) error {
	for i, path := range paths {
		if err := createFile(path, data[i], perms[i]); err != nil {
			for _, made := range paths[:i] {
				_ = os.Remove(made)
			}
			return err
		}
	}
	return nil
}

func createFile(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s %w", path, ErrKeyFileExists)
	}
	if err != nil {
		return writeError(path, err)
	}
	if err := writeAll(f, data, perm); err != nil {
		f.Close()
		_ = os.Remove(path)
		return writeError(path, err)
	}
	return nil
}

// replaceFiles writes each file beside its path first and then renames it
// over the path, so that a file is either the old one or the new one.
func replaceFiles(paths []string, data [][]byte, perms []fs.FileMode) error {
	temps := make([]string, 0, len(paths))
	defer func() {
		for _, t := range temps {
			_ = os.Remove(t)
		}
	}()
	for i, path := range paths {
		// CreateTemp makes the file with mode 0600: a private key is never
		// readable by others, not even for a moment.
		f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-*")
		if err != nil {
			return writeError(path, err)
		}
		temps = append(temps, f.Name())
		if err := writeAll(f, data[i], perms[i]); err != nil {
			f.Close()
			return writeError(path, err)
		}
	}
	for i, path := range paths {
		if err := os.Rename(temps[i], path); err != nil {
			return writeError(path, err)
		}
		temps[i] = ""
	}
	return nil
}

// writeAll writes data to f, sets its mode (which the umask may have
// narrowed) and makes it durable before it closes f.
func writeAll(f *os.File, data []byte, perm fs.FileMode) error {
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

func writeError(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		err = le.Err
	}
	return fmt.Errorf("cannot write %s: %w", path, err)
}

// sameFile reports whether two paths name one file, as far as their text
// says.
func sameFile(a, b string) bool {
	aa, err1 := filepath.Abs(a)
	bb, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && aa == bb
}

// wipe overwrites b, so that key material read from a file does not stay
// in memory longer than it is used.
func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}
