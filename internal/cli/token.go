package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/schema"
)

// DefaultTokenExpiry is how long a token made by `baton token create`
// works unless told otherwise.
const DefaultTokenExpiry = 30 * 24 * time.Hour

type tokenCmd struct {
	Create tokenCreateCmd `cmd:"" help:"Create an API token for a user (created when missing), or with --admin or --viewer an operator token for the console. The token is the last line printed."`
	List   tokenListCmd   `cmd:"" help:"List a user's tokens: id, name, created, expires, revoked, last used, kind (a user's, or a console admin's or viewer's); never the token."`
	Revoke tokenRevokeCmd `cmd:"" help:"Revoke a token by the id that create and list show; it is refused at once."`
}

type tokenCreateCmd struct {
	config.Database
	User      string        `name:"user" required:"" help:"User name the token belongs to."`
	ExpiresIn time.Duration `name:"expires-in" default:"${token_expiry}" help:"How long the token works, such as 720h; 0 never expires."`
	Admin     bool          `name:"admin" xor:"operator" help:"An operator token for the console (baton console) that reads and acts: retries, recorded outcomes, dead letters. It signs in to the console only; the API refuses it."`
	Viewer    bool          `name:"viewer" xor:"operator" help:"An operator token for the console that reads only. It signs in to the console only; the API refuses it."`
}

func (c *tokenCreateCmd) Run(ctx context.Context, env *Env) error {
	if c.ExpiresIn < 0 {
		return &UsageError{Err: fmt.Errorf("--expires-in %s: give a positive duration, such as 720h, or 0 for a token that never expires", c.ExpiresIn)}
	}
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	var expiresAt time.Time
	if c.ExpiresIn > 0 {
		expiresAt = time.Now().Add(c.ExpiresIn)
	}
	var role schema.OperatorRole
	switch {
	case c.Admin:
		role = schema.RoleAdmin
	case c.Viewer:
		role = schema.RoleViewer
	}
	var token string
	var user schema.User
	if role != "" {
		token, user, err = schema.CreateOperatorToken(ctx, pool, c.User, role, expiresAt)
	} else {
		token, user, err = schema.CreateTokenUntil(ctx, pool, c.User, expiresAt)
	}
	if err != nil {
		return err
	}
	expires := "never expires"
	if !user.TokenExpiresAt.IsZero() {
		expires = "expires " + user.TokenExpiresAt.UTC().Format(time.RFC3339)
	}
	kind := "token"
	if role != "" {
		kind = "console " + string(role) + " token"
	}
	fmt.Fprintf(env.Stdout, "created %s %d for user %q (user id %d, %s); it is shown only once:\n%s\n",
		kind, user.TokenID, user.Name, user.ID, expires, token)
	return nil
}

type tokenListCmd struct {
	config.Database
	User string `name:"user" required:"" help:"User whose tokens are listed."`
}

func (c *tokenListCmd) Run(ctx context.Context, env *Env) error {
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	tokens, err := schema.ListTokens(ctx, pool, c.User)
	if errors.Is(err, schema.ErrNotFound) {
		return &UsageError{Err: fmt.Errorf("no user %q: create one with `baton token create --user %s`", c.User, c.User)}
	}
	if err != nil {
		return err
	}
	now := time.Now()
	tw := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tCREATED\tEXPIRES\tREVOKED\tLAST USED\tKIND")
	for _, t := range tokens {
		name := "-"
		if t.PublicID != "" {
			// What the token text starts with, so its holder can find it.
			name = "baton_" + t.PublicID + "_..."
		}
		// A user's token, or an operator's of the console.
		kind := "user"
		if t.OperatorRole != "" {
			kind = "console-" + string(t.OperatorRole)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, name, t.State(now),
			timestamp(&t.CreatedAt, "-"), timestamp(t.ExpiresAt, "never"), timestamp(t.RevokedAt, "-"), timestamp(t.LastUsedAt, "never"), kind)
	}
	return tw.Flush()
}

func timestamp(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return t.UTC().Format(time.RFC3339)
}

type tokenRevokeCmd struct {
	config.Database
	ID int64 `arg:"" name:"id" help:"Token id, as create and list show it."`
}

func (c *tokenRevokeCmd) Run(ctx context.Context, env *Env) error {
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	t, err := schema.RevokeToken(ctx, pool, c.ID)
	if errors.Is(err, schema.ErrNotFound) {
		return &UsageError{Err: fmt.Errorf("no token with id %d: `baton token list --user NAME` shows a user's tokens", c.ID)}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "token %d of user %q revoked at %s; requests with it get 401\n", t.ID, t.UserName, timestamp(t.RevokedAt, "-"))
	return nil
}
