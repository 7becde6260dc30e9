package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/batonhq/baton/jwtauth"
)

// agentKeyCmd manages the key pair whose private key signs the worker's
// step requests to external agents and whose public key the API serves to
// them.
type agentKeyCmd struct {
	Create agentKeyCreateCmd `cmd:"" help:"Make an Ed25519 key pair: the worker signs its requests to external agents with the private key, the API serves the public key to them. Prints the key id, never the key."`
}

type agentKeyCreateCmd struct {
	PrivateKey string `name:"private-key" required:"" type:"path" placeholder:"FILE" help:"Where to write the private key (PEM, PKCS #8, mode 0600); the worker signs with it (--agent-signing-key)."`
	PublicKey  string `name:"public-key" required:"" type:"path" placeholder:"FILE" help:"Where to write the public key (PEM, mode 0644); the API serves it to agents (--agent-public-key)."`
	Force      bool   `name:"force" help:"Replace files that exist. Agents refuse the new key's tokens until the API serves its public key."`
}

func (c *agentKeyCreateCmd) Run(_ context.Context, env *Env) error {
	key, err := jwtauth.CreateKeyPair(c.PrivateKey, c.PublicKey, c.Force)
	if errors.Is(err, jwtauth.ErrKeyFileExists) {
		return fmt.Errorf("%w: keep it, choose other files, or replace the key pair with --force", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "created an Ed25519 key pair, key id %s\n  private key: %s (mode 0600; the worker's --agent-signing-key)\n  public key:  %s (the API's --agent-public-key, served at /.well-known/jwks.json)\n",
		key.KeyID(), absPath(c.PrivateKey), absPath(c.PublicKey))
	return nil
}

// absPath is path made absolute, for output that says where a file is
// whatever the reader's folder.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// agentPublicKeys loads the public keys the API serves to agents, from
// the files of --agent-public-key; nil when there are none. No error shows
// key material.
func agentPublicKeys(paths []string) (*jwtauth.PublicKeys, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	keys, err := jwtauth.LoadPublicKeys(paths...)
	if err != nil {
		return nil, &UsageError{Err: fmt.Errorf("--agent-public-key / BATON_AGENT_PUBLIC_KEY: %w", err)}
	}
	return keys, nil
}

// logAgentKeys says at start which agent keys the API serves.
func logAgentKeys(keys *jwtauth.PublicKeys, log zerolog.Logger) {
	if keys == nil {
		return
	}
	log.Info().Strs("key_ids", keys.KeyIDs()).Msg("serving the agent keys at /.well-known/jwks.json")
}
