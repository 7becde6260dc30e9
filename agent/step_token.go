package agent

import (
	"context"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/jwtauth"
)

// StepSigner is the StepAuthorizer of a worker: each step request carries
// a short-lived JWT signed with the worker's Ed25519 key, which the agent
// verifies against the keys the API serves at /.well-known/jwks.json. Its
// claims say who the request is for: sub, the conversation's owner;
// baton_conversation, baton_turn and baton_step, what it is about; aud,
// the agent; exp, no later than the turn's lease.
type StepSigner struct {
	// Key signs the tokens. Required.
	Key *jwtauth.SigningKey
	// Issuer is the tokens' iss. Defaults to jwtauth.DefaultStepIssuer.
	Issuer string
	// Audience is the tokens' aud: the agent's (ExternalConfig.Audience).
	// Required.
	Audience string
}

var _ StepAuthorizer = StepSigner{}

// Authorize signs the token of one request of req.
func (s StepSigner) Authorize(_ context.Context, req consumer.StepRequest, deadline time.Time) (string, error) {
	return s.Key.Sign(jwtauth.StepClaims{
		Issuer:       s.Issuer,
		Audience:     s.Audience,
		Subject:      req.Turn.Owner,
		Conversation: req.Turn.ConversationID,
		Turn:         req.Turn.TurnID,
		Step:         req.Key(),
		Expiry:       deadline,
	})
}
