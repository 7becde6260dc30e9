package console

import (
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/batonhq/baton/internal/setting"
	"github.com/batonhq/baton/jwtauth"
)

// Defaults of a Config.
const (
	DefaultSessionIdle     = 30 * time.Minute
	DefaultSessionMaxAge   = 12 * time.Hour
	DefaultRefreshInterval = 5 * time.Second
	DefaultSignInPerMinute = 10
	DefaultSignInBurst     = 5
	DefaultLeaseGrace      = time.Minute
	DefaultPendingAfter    = 2 * time.Minute
	DefaultApprovalAfter   = 24 * time.Hour
	DefaultPageSize        = 50
	DefaultMaxLagBytes     = 64 << 20
)

// Claim is a JWT claim and a value it must hold (a string equal to it, or
// an array with it as an element).
type Claim struct {
	Name, Value string
}

// ParseClaim reads NAME=VALUE.
func ParseClaim(s string) (Claim, error) {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" || value == "" {
		return Claim{}, fmt.Errorf("%q is not NAME=VALUE, such as roles=baton-admin", s)
	}
	return Claim{Name: name, Value: value}, nil
}

// String is NAME=VALUE.
func (c Claim) String() string {
	if c.Name == "" {
		return ""
	}
	return c.Name + "=" + c.Value
}

// Config configures the console.
type Config struct {
	// SessionIdle is how long a session may go unused before it ends.
	// Defaults to 30 minutes.
	SessionIdle time.Duration
	// SessionMaxAge is how long a session lasts at most, however much it
	// is used (and never longer than the JWT it was made from). Defaults
	// to 12 hours.
	SessionMaxAge time.Duration
	// RefreshInterval is how often open pages refresh what they show, and
	// how long the overview's data is kept: however many tabs are open,
	// the overview asks PostgreSQL and NATS once per interval. Defaults to
	// 5 seconds.
	RefreshInterval time.Duration
	// SignInPerMinute is how many sign-in attempts one client address may
	// make per minute, after a burst of SignInBurst. Defaults to 10 and 5.
	SignInPerMinute int
	SignInBurst     int
	// SecureCookies marks the session cookie Secure also when the request
	// did not come over TLS to this process: behind a proxy that ends TLS.
	// Over TLS it is always Secure. Defaults to off.
	SecureCookies bool
	// HideContent shows metadata only: no message text, tool arguments or
	// results, step answers or dead letter payloads. Defaults to off.
	HideContent bool
	// JWT is whose JSON Web Tokens sign operators in, beside operator
	// tokens. Defaults to none.
	JWT jwtauth.Config
	// AdminClaim and ViewerClaim say which JWTs are operators': a token
	// whose claim holds AdminClaim's value acts, one with ViewerClaim's
	// reads; any other gets 403. Required with JWT.
	AdminClaim, ViewerClaim Claim
	// LeaseGrace is how long past its expiry a lease may stay held before
	// its turn counts as stuck. Defaults to 1 minute.
	LeaseGrace time.Duration
	// PendingAfter is how long a message may wait for a turn, unclaimed
	// since its last announcement, before it counts as stuck. Defaults to
	// 2 minutes (the relay's sweep announces such rows after 1 minute).
	PendingAfter time.Duration
	// ApprovalAfter is how long a call or a question may wait for a
	// person before its turn counts as stuck. Defaults to 24 hours.
	ApprovalAfter time.Duration
	// PageSize is how many rows a page lists. Defaults to 50.
	PageSize int
	// MaxLagBytes is the slot lag above which the overview says the relay
	// needs attention. Defaults to 64 MiB.
	MaxLagBytes int64
	// Slot and Stream are the relay's replication slot and the outbox
	// stream that the overview shows.
	Slot, Stream string
	// Logger receives the console's logs. Defaults to none.
	Logger *zerolog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its
// default.
func (c Config) WithDefaults() Config {
	if c.SessionIdle == 0 {
		c.SessionIdle = DefaultSessionIdle
	}
	if c.SessionMaxAge == 0 {
		c.SessionMaxAge = DefaultSessionMaxAge
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.SignInPerMinute == 0 {
		c.SignInPerMinute = DefaultSignInPerMinute
	}
	if c.SignInBurst == 0 {
		c.SignInBurst = DefaultSignInBurst
	}
	if c.LeaseGrace == 0 {
		c.LeaseGrace = DefaultLeaseGrace
	}
	if c.PendingAfter == 0 {
		c.PendingAfter = DefaultPendingAfter
	}
	if c.ApprovalAfter == 0 {
		c.ApprovalAfter = DefaultApprovalAfter
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.MaxLagBytes == 0 {
		c.MaxLagBytes = DefaultMaxLagBytes
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	return c
}

// Validate returns a *setting.Error for the first setting that cannot
// work.
func (c Config) Validate() error {
	switch {
	case c.SessionIdle < time.Minute:
		return setting.Errorf("SessionIdle", c.SessionIdle, "must be at least 1m, such as %s", DefaultSessionIdle)
	case c.SessionMaxAge < c.SessionIdle:
		return setting.Errorf("SessionMaxAge", c.SessionMaxAge, "must be at least the idle timeout %s", c.SessionIdle)
	case c.RefreshInterval < 500*time.Millisecond:
		return setting.Errorf("RefreshInterval", c.RefreshInterval, "must be at least 500ms, such as %s", DefaultRefreshInterval)
	case c.SignInPerMinute < 1:
		return setting.Errorf("SignInPerMinute", c.SignInPerMinute, "must be at least 1, such as %d", DefaultSignInPerMinute)
	case c.SignInBurst < 1:
		return setting.Errorf("SignInBurst", c.SignInBurst, "must be at least 1, such as %d", DefaultSignInBurst)
	case c.LeaseGrace < 0:
		return setting.Errorf("LeaseGrace", c.LeaseGrace, "must not be negative")
	case c.PendingAfter <= 0:
		return setting.Errorf("PendingAfter", c.PendingAfter, "must be positive, such as %s", DefaultPendingAfter)
	case c.ApprovalAfter <= 0:
		return setting.Errorf("ApprovalAfter", c.ApprovalAfter, "must be positive, such as %s", DefaultApprovalAfter)
	case c.MaxLagBytes < 0:
		return setting.Errorf("MaxLagBytes", c.MaxLagBytes, "must not be negative, such as %d", DefaultMaxLagBytes)
	case c.PageSize < 1 || c.PageSize > 1000:
		return setting.Errorf("PageSize", c.PageSize, "must be 1 to 1000, such as %d", DefaultPageSize)
	}
	if err := c.JWT.WithDefaults().Validate(); err != nil {
		return setting.Within("JWT", err)
	}
	if c.JWT.Enabled() && c.AdminClaim.Name == "" && c.ViewerClaim.Name == "" {
		return setting.Errorf("AdminClaim", "", "is required when JWTs sign operators in: name the claim and value of the operators who act, such as roles=baton-admin")
	}
	if !c.JWT.Enabled() && (c.AdminClaim.Name != "" || c.ViewerClaim.Name != "") {
		return setting.Errorf("AdminClaim", c.AdminClaim.String(), "needs a JWT issuer: set the JWT settings too, or leave the claims out")
	}
	return nil
}
