package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	natsclient "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/internal/status"
	"github.com/batonhq/baton/jwtauth"
	batonnats "github.com/batonhq/baton/nats"
)

// ExitNeedsAttention is the exit code of `baton status` when something
// needs an operator's attention.
const ExitNeedsAttention = 3

type statusCmd struct {
	config.Database
	config.NATS
	config.Stream
	config.Replication
	JSON          bool          `name:"json" help:"Print the report as JSON."`
	MaxLag        int64         `name:"max-lag-bytes" env:"BATON_STATUS_MAX_LAG_BYTES" help:"Slot lag (bytes) above which the relay needs attention." default:"67108864"`
	MaxPendingAge time.Duration `name:"max-pending-age" env:"BATON_RELAY_SWEEP_AGE" help:"Age of the oldest pending row above which it needs attention (the sweeper's age)." default:"${sweep_age}"`
	StallAfter    time.Duration `name:"stall-after" env:"BATON_STATUS_STALL_AFTER" help:"How long the slot's confirmed position may stand still while WAL waits behind it, a consumer of the stream may go without an acknowledgement while events wait for it, and an external agent may fail every step request while workers still send them, before any needs attention." default:"${stall_after}"`
	LeaseGrace    time.Duration `name:"lease-grace" env:"BATON_STATUS_LEASE_GRACE" help:"How long past its expiry a run may hold a conversation's lease before it needs attention (workers recover expired leases every half lease)." default:"${lease_grace}"`
	// The API's sign-in, shown with its issuer's keys fetched.
	jwtFlags `embed:""`
}

func (c *statusCmd) Run(ctx context.Context, env *Env) error {
	if err := c.Replication.Validate(); err != nil {
		return &UsageError{Err: err}
	}
	if c.StallAfter <= 0 {
		return &UsageError{Err: fmt.Errorf("--stall-after / BATON_STATUS_STALL_AFTER %s: give a positive duration, such as %s", c.StallAfter, status.DefaultStallAfter)}
	}
	if c.LeaseGrace <= 0 {
		return &UsageError{Err: fmt.Errorf("--lease-grace / BATON_STATUS_LEASE_GRACE %s: give a positive duration, such as %s", c.LeaseGrace, status.DefaultLeaseGrace)}
	}
	jwtCfg, err := c.jwtConfig()
	if err != nil {
		return err
	}
	verifier, err := jwtauth.New(jwtCfg)
	if err != nil {
		return settingError(c, setting.Within("JWT", err))
	}
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()

	var js jetstream.JetStream
	log := env.Log.With().Str("component", "status").Logger()
	if nc, err := connectNATS(c.NATS.Options("status"), log, natsclient.Timeout(3*time.Second), natsclient.MaxReconnects(0)); err == nil {
		defer nc.Close()
		js, _ = jetstream.New(nc)
		// The stream is the relay's: a setting given here that disagrees
		// with it is a mistake worth stopping on.
		if explicit := c.StreamConfig(); explicit != (batonnats.StreamConfig{Name: explicit.Name}) {
			if _, err := batonnats.JoinStream(ctx, js, explicit); err != nil && !errors.Is(err, batonnats.ErrStreamMissing) {
				return settingError(c, setting.Within("Stream", err))
			}
		}
	} else {
		// The error names the server with its credentials redacted.
		log.Warn().Err(err).Msg("NATS is not reachable")
	}
	gctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rep, err := status.Gather(gctx, pool, js, status.Options{
		Slot: c.Slot, Stream: c.StreamConfig().WithDefaults().Name, MaxLagBytes: c.MaxLag, MaxPendingAge: c.MaxPendingAge,
		StallAfter: c.StallAfter, LeaseGrace: c.LeaseGrace,
	})
	if err != nil {
		return err
	}
	if verifier != nil {
		rep.SetSignIn(signInStatus(gctx, verifier))
	} else {
		rep.SetSignIn(status.SignIn{BatonTokens: true})
	}
	if c.JSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := rep.WriteText(env.Stdout); err != nil {
		return err
	}
	if len(rep.Attention) > 0 {
		return &ExitError{Code: ExitNeedsAttention, Err: errors.New("needs attention")}
	}
	return nil
}
