package jwtauth_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/batonhq/baton/jwtauth"
)

// The worker signs a token for each step request with its private key;
// the API serves the public key as a JWKS, and the agent verifies the
// token against it.
func ExampleSigningKey_Sign() {
	dir, _ := os.MkdirTemp("", "agent-key")
	defer os.RemoveAll(dir)
	privPath, pubPath := filepath.Join(dir, "agent.key"), filepath.Join(dir, "agent.pub")
	if _, err := jwtauth.CreateKeyPair(privPath, pubPath, false); err != nil {
		panic(err)
	}

	// The worker (--agent-signing-key).
	key, err := jwtauth.LoadSigningKey(privPath)
	if err != nil {
		panic(err)
	}
	token, err := key.Sign(jwtauth.StepClaims{
		Audience: "https://agent.example/step", Subject: "alice",
		Conversation: "c_0123", Turn: "t_4567", Step: "step_89ab",
		Expiry: time.Now().Add(30 * time.Second), // the lease's deadline
	})
	if err != nil {
		panic(err)
	}

	// The API (--agent-public-key) serves keys.JWKS() at
	// /.well-known/jwks.json.
	keys, err := jwtauth.LoadPublicKeys(pubPath)
	if err != nil {
		panic(err)
	}

	// The agent.
	var set jose.JSONWebKeySet
	_ = json.Unmarshal(keys.JWKS(), &set)
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		panic(err)
	}
	var std jwt.Claims
	var baton struct {
		Conversation string `json:"baton_conversation"`
		Turn         string `json:"baton_turn"`
		Step         string `json:"baton_step"`
	}
	if err := tok.Claims(set.Key(tok.Headers[0].KeyID)[0].Key, &std, &baton); err != nil {
		panic(err)
	}
	if err := std.Validate(jwt.Expected{Issuer: "baton", AnyAudience: jwt.Audience{"https://agent.example/step"}}); err != nil {
		panic(err)
	}
	fmt.Println(std.Subject, baton.Conversation, baton.Turn, baton.Step)
	// Output: alice c_0123 t_4567 step_89ab
}
