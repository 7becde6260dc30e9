package jwtauth_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/secretscan"
	"github.com/batonhq/baton/jwtauth"
)

const agentAudience = "https://agent.example/step"

// keyPair makes a key pair under a new folder and returns its files and
// the signing key loaded from the private one.
func keyPair(t *testing.T) (privPath, pubPath string, key *jwtauth.SigningKey) {
	t.Helper()
	dir := t.TempDir()
	privPath, pubPath = filepath.Join(dir, "agent.key"), filepath.Join(dir, "agent.pub")
	made, err := jwtauth.CreateKeyPair(privPath, pubPath, false)
	require.NoError(t, err)
	key, err = jwtauth.LoadSigningKey(privPath)
	require.NoError(t, err)
	require.Equal(t, made.KeyID(), key.KeyID(), "the key loaded from the file is the key made")
	return privPath, pubPath, key
}

func stepClaims(exp time.Time) jwtauth.StepClaims {
	return jwtauth.StepClaims{
		Audience: agentAudience, Subject: "https://app.example/|user-7",
		Conversation: "c_0123456789abcdef", Turn: "t_fedcba9876543210", Step: "step_00112233445566778899aabbccddeeff",
		Expiry: exp,
	}
}

// verify checks token as an agent would, with go-jose against the JWKS
// jwks: EdDSA only, the key of its kid, iss, aud and exp. It returns the
// claims.
func verify(t *testing.T, jwks []byte, token string) (map[string]any, error) {
	t.Helper()
	var set jose.JSONWebKeySet
	require.NoError(t, json.Unmarshal(jwks, &set))
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return nil, err
	}
	keys := set.Key(tok.Headers[0].KeyID)
	if len(keys) != 1 {
		return nil, fmt.Errorf("no key %q in the JWKS", tok.Headers[0].KeyID)
	}
	var std jwt.Claims
	var all map[string]any
	if err := tok.Claims(keys[0].Key, &std, &all); err != nil {
		return nil, err
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: "baton", AnyAudience: jwt.Audience{agentAudience}, Time: time.Now()}, 0); err != nil {
		return nil, err
	}
	return all, nil
}

func TestAStepTokenVerifiesWithGoJoseAgainstTheJWKSOfItsPublicKey(t *testing.T) {
	t.Parallel()
	_, pubPath, key := keyPair(t)
	keys, err := jwtauth.LoadPublicKeys(pubPath)
	require.NoError(t, err)
	require.Equal(t, []string{key.KeyID()}, keys.KeyIDs())

	var doc struct {
		Keys []map[string]any `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(keys.JWKS(), &doc))
	require.Len(t, doc.Keys, 1)
	jwk := doc.Keys[0]
	require.Equal(t, "OKP", jwk["kty"])
	require.Equal(t, "Ed25519", jwk["crv"])
	require.Equal(t, "EdDSA", jwk["alg"])
	require.Equal(t, "sig", jwk["use"])
	require.Equal(t, key.KeyID(), jwk["kid"])
	require.NotEmpty(t, jwk["x"])
	require.NotContains(t, jwk, "d", "the JWKS holds no private part")

	before := time.Now().Truncate(time.Second)
	exp := time.Now().Add(30 * time.Second)
	token, err := key.Sign(stepClaims(exp))
	require.NoError(t, err)

	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.EdDSA})
	require.NoError(t, err)
	h := tok.Headers[0]
	require.Equal(t, "EdDSA", h.Algorithm)
	require.Equal(t, key.KeyID(), h.KeyID)
	require.Equal(t, "JWT", h.ExtraHeaders[jose.HeaderType])

	claims, err := verify(t, keys.JWKS(), token)
	require.NoError(t, err)
	require.Equal(t, "baton", claims["iss"])
	require.Equal(t, agentAudience, claims["aud"], "one audience, as a string")
	require.Equal(t, "https://app.example/|user-7", claims["sub"])
	require.Equal(t, "c_0123456789abcdef", claims["baton_conversation"])
	require.Equal(t, "t_fedcba9876543210", claims["baton_turn"])
	require.Equal(t, "step_00112233445566778899aabbccddeeff", claims["baton_step"])
	require.Equal(t, float64(exp.Unix()), claims["exp"])
	require.GreaterOrEqual(t, claims["iat"], float64(before.Unix()))
	require.NotContains(t, claims, "nbf", "valid from iat: an agent's clock a little behind must not refuse it")

	again, err := key.Sign(stepClaims(exp))
	require.NoError(t, err)
	againClaims, err := verify(t, keys.JWKS(), again)
	require.NoError(t, err)
	require.NotEmpty(t, claims["jti"])
	require.NotEqual(t, claims["jti"], againClaims["jti"], "every token has its own jti, also for the same step")
	require.Equal(t, claims["baton_step"], againClaims["baton_step"])

	c := stepClaims(exp)
	c.Issuer = "https://baton.example"
	other, err := key.Sign(c)
	require.NoError(t, err)
	_, err = verify(t, keys.JWKS(), other)
	require.ErrorIs(t, err, jwt.ErrInvalidIssuer, "the issuer is the one configured")
}

func TestATamperedStepTokenOrOneOfAnotherKeyFailsToVerify(t *testing.T) {
	t.Parallel()
	_, pubPath, key := keyPair(t)
	keys, err := jwtauth.LoadPublicKeys(pubPath)
	require.NoError(t, err)
	token, err := key.Sign(stepClaims(time.Now().Add(time.Minute)))
	require.NoError(t, err)
	_, err = verify(t, keys.JWKS(), token)
	require.NoError(t, err)
	parts := strings.Split(token, ".")

	// Another user in the claims, the signature kept.
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	forged := strings.Replace(string(payload), "user-7", "user-8", 1)
	require.NotEqual(t, string(payload), forged)
	_, err = verify(t, keys.JWKS(), parts[0]+"."+base64.RawURLEncoding.EncodeToString([]byte(forged))+"."+parts[2])
	require.Error(t, err, "changed claims must not verify")

	// One bit of the signature flipped.
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	require.NoError(t, err)
	sig[0] ^= 1
	_, err = verify(t, keys.JWKS(), parts[0]+"."+parts[1]+"."+base64.RawURLEncoding.EncodeToString(sig))
	require.Error(t, err, "a changed signature must not verify")

	// Signed by another key that claims the served key's kid.
	_, otherPriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: jose.JSONWebKey{Key: otherPriv, KeyID: key.KeyID()}},
		(&jose.SignerOptions{}).WithType("JWT"))
	require.NoError(t, err)
	var original map[string]any
	require.NoError(t, json.Unmarshal(payload, &original))
	impostor, err := jwt.Signed(signer).Claims(original).Serialize()
	require.NoError(t, err)
	_, err = verify(t, keys.JWKS(), impostor)
	require.Error(t, err, "a token of another key must not verify, whatever kid it names")

	// Unsigned.
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT","kid":"`+key.KeyID()+`"}`)) + "." + parts[1] + "."
	_, err = verify(t, keys.JWKS(), none)
	require.Error(t, err, "alg none must not verify")

	// Expired: signed with an expiry a second away, checked after it.
	short, err := key.Sign(stepClaims(time.Now().Add(1100 * time.Millisecond)))
	require.NoError(t, err)
	var set jose.JSONWebKeySet
	require.NoError(t, json.Unmarshal(keys.JWKS(), &set))
	tok, err := jwt.ParseSigned(short, []jose.SignatureAlgorithm{jose.EdDSA})
	require.NoError(t, err)
	var std jwt.Claims
	require.NoError(t, tok.Claims(set.Keys[0].Key, &std))
	require.ErrorIs(t, std.ValidateWithLeeway(jwt.Expected{Time: time.Now().Add(3 * time.Second)}, 0), jwt.ErrExpired)
}

// The private key of RFC 8037, appendix A.1, and the thumbprint of its
// public key that appendix A.3 computes.
const (
	rfc8037Seed       = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"
	rfc8037X          = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
	rfc8037Thumbprint = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
)

func TestTheKeyIDIsTheRFC7638ThumbprintOfThePublicKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	seed, err := base64.RawURLEncoding.DecodeString(rfc8037Seed)
	require.NoError(t, err)
	priv := ed25519.NewKeyFromSeed(seed)
	require.Equal(t, rfc8037X, base64.RawURLEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)))
	privPath := writePEM(t, dir, "rfc.key", "PRIVATE KEY", pkcs8(t, priv), 0o600)
	pubPath := writePEM(t, dir, "rfc.pub", "PUBLIC KEY", pkix(t, priv.Public()), 0o644)

	key, err := jwtauth.LoadSigningKey(privPath)
	require.NoError(t, err)
	require.Equal(t, rfc8037Thumbprint, key.KeyID(), "the thumbprint RFC 8037 computes for its example key")
	keys, err := jwtauth.LoadPublicKeys(pubPath)
	require.NoError(t, err)
	require.Equal(t, []string{rfc8037Thumbprint}, keys.KeyIDs())

	// And for a new key, the thumbprint computed by hand: SHA-256 of the
	// required members in lexicographic order, without white space.
	_, pubPath, made := keyPair(t)
	b, err := os.ReadFile(pubPath)
	require.NoError(t, err)
	block, _ := pem.Decode(b)
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + base64.RawURLEncoding.EncodeToString(pub.(ed25519.PublicKey)) + `"}`))
	require.Equal(t, base64.RawURLEncoding.EncodeToString(sum[:]), made.KeyID())
}

func TestSignRefusesAnExpiryNotInTheFutureAndAMissingClaim(t *testing.T) {
	t.Parallel()
	_, _, key := keyPair(t)
	for _, exp := range []time.Time{{}, time.Now().Add(-time.Second), time.Now().Truncate(time.Second)} {
		_, err := key.Sign(stepClaims(exp))
		require.Error(t, err, "expiry %v", exp)
		require.ErrorContains(t, err, "xpiry", "the error names the expiry")
	}
	for _, blank := range []func(*jwtauth.StepClaims){
		func(c *jwtauth.StepClaims) { c.Audience = "" },
		func(c *jwtauth.StepClaims) { c.Subject = "" },
		func(c *jwtauth.StepClaims) { c.Conversation = "" },
		func(c *jwtauth.StepClaims) { c.Turn = "" },
		func(c *jwtauth.StepClaims) { c.Step = "" },
	} {
		c := stepClaims(time.Now().Add(time.Minute))
		blank(&c)
		_, err := key.Sign(c)
		require.ErrorContains(t, err, "a step token needs StepClaims.")
	}
}

func TestEveryKeyOfARotationIsServedOnceAndVerifiesItsTokens(t *testing.T) {
	t.Parallel()
	_, oldPub, oldKey := keyPair(t)
	newPriv, newPub, newKey := keyPair(t)
	// The new key's private file gives its public half; the old key
	// twice is served once.
	keys, err := jwtauth.LoadPublicKeys(oldPub, newPriv, oldPub, newPub)
	require.NoError(t, err)
	require.Equal(t, []string{oldKey.KeyID(), newKey.KeyID()}, keys.KeyIDs())
	require.NotContains(t, string(keys.JWKS()), `"d"`, "a private key file gives its public half only")
	for _, k := range []*jwtauth.SigningKey{oldKey, newKey} {
		token, err := k.Sign(stepClaims(time.Now().Add(time.Minute)))
		require.NoError(t, err)
		_, err = verify(t, keys.JWKS(), token)
		require.NoError(t, err, "a token of %s", k)
	}
	// Once the old key is withdrawn, its tokens fail.
	withdrawn, err := jwtauth.LoadPublicKeys(newPub)
	require.NoError(t, err)
	token, err := oldKey.Sign(stepClaims(time.Now().Add(time.Minute)))
	require.NoError(t, err)
	_, err = verify(t, withdrawn.JWKS(), token)
	require.Error(t, err)
}

func TestCreateKeyPairWritesTheModesAndNeverReplacesByAccident(t *testing.T) {
	t.Parallel()
	privPath, pubPath, key := keyPair(t)
	for path, mode := range map[string]os.FileMode{privPath: 0o600, pubPath: 0o644} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, mode, fi.Mode().Perm(), path)
	}
	before, err := os.ReadFile(privPath)
	require.NoError(t, err)

	_, err = jwtauth.CreateKeyPair(privPath, filepath.Join(t.TempDir(), "new.pub"), false)
	require.ErrorIs(t, err, jwtauth.ErrKeyFileExists)
	require.ErrorContains(t, err, privPath)
	fresh := filepath.Join(t.TempDir(), "new.key")
	_, err = jwtauth.CreateKeyPair(fresh, pubPath, false)
	require.ErrorIs(t, err, jwtauth.ErrKeyFileExists)
	require.NoFileExists(t, fresh, "nothing is written when one file exists")
	after, err := os.ReadFile(privPath)
	require.NoError(t, err)
	require.Equal(t, before, after)

	replaced, err := jwtauth.CreateKeyPair(privPath, pubPath, true)
	require.NoError(t, err)
	require.NotEqual(t, key.KeyID(), replaced.KeyID())
	loaded, err := jwtauth.LoadSigningKey(privPath)
	require.NoError(t, err)
	require.Equal(t, replaced.KeyID(), loaded.KeyID())
	keys, err := jwtauth.LoadPublicKeys(pubPath)
	require.NoError(t, err)
	require.Equal(t, []string{replaced.KeyID()}, keys.KeyIDs(), "both files replaced, one pair again")
	fi, err := os.Stat(privPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	left, err := filepath.Glob(filepath.Join(filepath.Dir(privPath), ".*"))
	require.NoError(t, err)
	require.Empty(t, left, "no temporary file is left behind")

	_, err = jwtauth.CreateKeyPair(privPath, privPath, true)
	require.ErrorContains(t, err, "one file")
	_, err = jwtauth.CreateKeyPair(filepath.Join(t.TempDir(), "missing", "a.key"), filepath.Join(t.TempDir(), "a.pub"), false)
	require.ErrorContains(t, err, "cannot write")
}

func TestBadKeyFilesSayWhatIsWrongAndShowNoKeyMaterial(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	der := pkcs8(t, priv)
	body := base64.StdEncoding.EncodeToString(der)
	secrets := []secretscan.Secret{
		{Name: "seed, base64url", Value: base64.RawURLEncoding.EncodeToString(priv.Seed())},
		{Name: "seed, base64", Value: base64.StdEncoding.EncodeToString(priv.Seed())},
		{Name: "seed, hex", Value: hex.EncodeToString(priv.Seed())},
		{Name: "PEM body", Value: body[:40]},
		{Name: "PEM body's end", Value: body[len(body)-20:]},
		{Name: "the text of a file that is not PEM", Value: "not-a-key-but-a-secret-0xC0FFEE"},
		{Name: "an unknown PEM type", Value: "SECRET-TYPE-4711"},
	}
	privPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), mode))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	for _, c := range []struct {
		name      string
		path      string
		signing   bool // LoadSigningKey; otherwise LoadPublicKeys
		wantParts []string
	}{
		{"missing", filepath.Join(dir, "missing.key"), true, []string{"does not exist", "baton agent-key create"}},
		{"a folder", dir, true, []string{"not a regular file"}},
		{"not PEM", write("text.key", "not-a-key-but-a-secret-0xC0FFEE\n", 0o600), true, []string{"is not a PEM key file", "openssl genpkey -algorithm ed25519"}},
		{"a public key to sign with", writePEM(t, dir, "pub.pem", "PUBLIC KEY", pkix(t, priv.Public()), 0o644), true, []string{"holds a public key", "--private-key"}},
		{"open to every user", write("open.key", privPEM, 0o644), true, []string{"every user of this machine", "mode 0644", "chmod 600"}},
		{"open to every user, as a public key", write("open2.key", privPEM, 0o604), false, []string{"every user of this machine", "chmod 600"}},
		{"an RSA key in PKCS #8", writePEM(t, dir, "rsa.key", "PRIVATE KEY", pkcs8(t, rsaKey), 0o600), true, []string{"holds an RSA key", "Ed25519"}},
		{"an ECDSA key in PKCS #8", writePEM(t, dir, "ec.key", "PRIVATE KEY", pkcs8(t, ec), 0o600), true, []string{"holds an ECDSA key"}},
		{"an RSA public key", writePEM(t, dir, "rsa.pub", "PUBLIC KEY", pkix(t, rsaKey.Public()), 0o644), false, []string{"public key of another type than Ed25519"}},
		{"an EC key in SEC 1", writePEM(t, dir, "sec1.key", "EC PRIVATE KEY", der, 0o600), true, []string{"holds an EC key"}},
		{"an encrypted key", writePEM(t, dir, "enc.key", "ENCRYPTED PRIVATE KEY", der, 0o600), true, []string{"encrypted private key", "openssl pkey"}},
		{"an OpenSSH key", writePEM(t, dir, "id_ed25519", "OPENSSH PRIVATE KEY", der, 0o600), true, []string{"OpenSSH key"}},
		{"an unknown PEM type", writePEM(t, dir, "odd.key", "SECRET-TYPE-4711", der, 0o600), true, []string{"no Ed25519 key"}},
		{"a broken PKCS #8 key", writePEM(t, dir, "broken.key", "PRIVATE KEY", der[:len(der)-3], 0o600), true, []string{"not a valid PKCS #8 key"}},
		{"two keys", write("two.key", privPEM+privPEM, 0o600), true, []string{"more than one PEM block"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var err error
			if c.signing {
				_, err = jwtauth.LoadSigningKey(c.path)
			} else {
				_, err = jwtauth.LoadPublicKeys(c.path)
			}
			require.Error(t, err)
			msg := err.Error()
			require.Contains(t, msg, c.path, "the error names the file")
			for _, want := range c.wantParts {
				require.Contains(t, msg, want)
			}
			for _, s := range secrets {
				require.Empty(t, s.In(msg), "the error shows the %s: %s", s.Name, s.Mask(msg))
			}
		})
	}

	// A good key prints its id, never its material.
	key, err := jwtauth.LoadSigningKey(write("good.key", privPEM, 0o600))
	require.NoError(t, err)
	shown := fmt.Sprintf("%v %+v %#v %s %v %+v %#v", key, key, key, key, *key, *key, *key)
	require.Contains(t, shown, key.KeyID())
	for _, s := range secrets {
		require.Empty(t, s.In(shown), "%%v shows the %s: %s", s.Name, s.Mask(shown))
	}
	// Group access is allowed: a service's group reads its credential.
	_, err = jwtauth.LoadSigningKey(write("group.key", privPEM, 0o640))
	require.NoError(t, err)
}

func pkcs8(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return der
}

func pkix(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(key)
	require.NoError(t, err)
	return der
}

func writePEM(t *testing.T, dir, name, typ string, der []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode))
	require.NoError(t, os.Chmod(p, mode))
	return p
}
