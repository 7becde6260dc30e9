package jwtauth

import (
	"encoding/json"
	"errors"
	"slices"

	"github.com/go-jose/go-jose/v4"
)

// PublicKeys are the public halves of the keys that sign step tokens,
// rendered as the JWKS that agents verify the tokens with. Several keys
// serve a rotation: the new key's beside the old one's until no token of
// the old one is in flight.
type PublicKeys struct {
	ids  []string
	jwks []byte
}

// LoadPublicKeys reads Ed25519 keys in PEM, one per file: public keys
// (PKIX, -----BEGIN PUBLIC KEY-----) or private keys (PKCS #8), of which
// it takes the public half only; a private key file must be closed to
// other users, as LoadSigningKey wants it. A key given twice is served
// once. Errors name the file and say how to fix it; none holds key
// material.
func LoadPublicKeys(paths ...string) (*PublicKeys, error) {
	if len(paths) == 0 {
		return nil, errors.New("jwtauth: no public key file given")
	}
	var (
		k    PublicKeys
		keys []jose.JSONWebKey
	)
	for _, path := range paths {
		f, err := readKeyFile(path)
		if err != nil {
			return nil, err
		}
		kid, err := keyID(f.public)
		if err != nil {
			return nil, err
		}
		if slices.Contains(k.ids, kid) {
			continue
		}
		k.ids = append(k.ids, kid)
		keys = append(keys, jose.JSONWebKey{Key: f.public, KeyID: kid, Algorithm: string(jose.EdDSA), Use: "sig"})
	}
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: keys})
	if err != nil {
		return nil, err
	}
	k.jwks = jwks
	return &k, nil
}

// KeyIDs are the kids of the keys, in the order their files were given.
func (k *PublicKeys) KeyIDs() []string { return append([]string(nil), k.ids...) }

// JWKS is the JSON Web Key Set of the keys, as GET /.well-known/jwks.json
// serves it: {"keys":[{"kty":"OKP","crv":"Ed25519","x":...,"kid":...,
// "alg":"EdDSA","use":"sig"}]}.
func (k *PublicKeys) JWKS() []byte { return append([]byte(nil), k.jwks...) }
