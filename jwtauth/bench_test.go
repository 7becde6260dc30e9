package jwtauth

import (
	"context"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/batonhq/baton/internal/oidctest"
)

// BenchmarkVerify measures the verification of one token of each accepted
// algorithm, its key already fetched: what a JWT adds to a request before
// the database is asked for its user.
//
//	go test -run '^$' -bench BenchmarkVerify -benchmem ./jwtauth/
func BenchmarkVerify(b *testing.B) {
	ks := oidctest.NewKeyServer(b)
	secret := []byte("0123456789abcdef0123456789abcdef")
	v, err := New(Config{Issuer: ks.Issuer, Audience: audience, AllowHTTP: true, HS256Secret: secret, HS256Issuer: hs256Issuer})
	if err != nil {
		b.Fatal(err)
	}
	tokens := map[string]string{"HS256": oidctest.HS256(b, secret, oidctest.Claims(hs256Issuer, "alice", audience, time.Hour))}
	for _, alg := range []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.EdDSA} {
		tokens[string(alg)] = ks.NewPublishedKey(b, alg).Sign(b, oidctest.Claims(ks.Issuer, "alice", audience, time.Hour))
	}
	ctx := context.Background()
	for _, alg := range []string{"HS256", "RS256", "ES256", "EdDSA"} {
		b.Run(alg, func(b *testing.B) {
			token := tokens[alg]
			if _, err := v.Verify(ctx, token); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(ctx, token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
