package cli

import (
	"context"
	"fmt"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/schema"
)

type tokenCmd struct {
	Create tokenCreateCmd `cmd:"" help:"Create an API token for a user (created when missing). The token is the last line printed."`
}

type tokenCreateCmd struct {
	config.Database
	User string `name:"user" required:"" help:"User name the token belongs to."`
}

func (c *tokenCreateCmd) Run(ctx context.Context, env *Env) error {
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	token, user, err := schema.CreateToken(ctx, pool, c.User)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "created a token for user %q (id %d); it is shown only once:\n%s\n", user.Name, user.ID, token)
	return nil
}
