package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/consumer/group"
	"github.com/batonhq/baton/internal/config"
	"github.com/batonhq/baton/schema"
)

// deadLettersCmd is `baton group dead-letters`: what a group parked after
// its attempt cap, and what an operator does about it once the cause is
// fixed. Nothing here deletes a dead letter: a retry that applies one
// marks it resolved as applied, a discard marks it resolved as discarded.
type deadLettersCmd struct {
	List    deadLettersListCmd    `cmd:"" help:"List a group's parked events (unresolved ones; --all for every one)."`
	Retry   deadLettersRetryCmd   `cmd:"" help:"Apply parked events again with the group's handler, in this process: the ids given, or --all unresolved ones."`
	Discard deadLettersDiscardCmd `cmd:"" help:"Give a parked event up: it stays listed, resolved as discarded, and no replay applies it later."`
}

type deadLettersListCmd struct {
	config.Database `embed:""`

	Group string `arg:"" help:"Group whose dead letters to list, such as audit or webhook."`
	All   bool   `name:"all" help:"List resolved dead letters too."`
	JSON  bool   `name:"json" help:"Print them as JSON."`
}

func (c *deadLettersListCmd) Run(ctx context.Context, env *Env) error {
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	dead, err := schema.DeadLetters(ctx, pool, c.Group, c.All)
	if err != nil {
		return err
	}
	if c.JSON {
		return writeDeadLettersJSON(env.Stdout, dead)
	}
	return writeDeadLetters(env.Stdout, c.Group, c.All, dead)
}

// deadLetterView is a dead letter as the list shows it: without the
// event's body, with its error's URLs stripped of credentials.
type deadLetterView struct {
	ID         int64      `json:"id"`
	Group      string     `json:"group"`
	EventID    string     `json:"event_id"`
	Stream     string     `json:"stream"`
	StreamSeq  uint64     `json:"stream_seq"`
	OutboxID   *int64     `json:"outbox_id,omitempty"`
	Attempts   int        `json:"attempts"`
	Parked     int        `json:"times_parked"`
	ParkedAt   time.Time  `json:"parked_at"`
	State      string     `json:"state"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	Error      string     `json:"error"`
}

func viewOf(d schema.DeadLetter) deadLetterView {
	state := "parked"
	if d.ResolvedAt != nil {
		state = d.Resolution
	}
	return deadLetterView{
		ID: d.ID, Group: d.Group, EventID: d.EventID, Stream: d.Stream, StreamSeq: d.StreamSeq, OutboxID: d.OutboxID,
		Attempts: d.Attempts, Parked: d.Parked, ParkedAt: d.ParkedAt, State: state, ResolvedAt: d.ResolvedAt,
		Error: redactErrorText(d.Error),
	}
}

func writeDeadLettersJSON(w io.Writer, dead []schema.DeadLetter) error {
	out := make([]deadLetterView, 0, len(dead))
	for _, d := range dead {
		out = append(out, viewOf(d))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"dead_letters": out})
}

func writeDeadLetters(w io.Writer, groupName string, all bool, dead []schema.DeadLetter) error {
	if len(dead) == 0 {
		what := "no unresolved dead letters"
		if all {
			what = "no dead letters"
		}
		_, err := fmt.Fprintf(w, "group %s has %s\n", groupName, what)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT\tSTREAM SEQ\tPARKED AT\tATTEMPTS\tTIMES PARKED\tSTATE\tERROR")
	for _, d := range dead {
		v := viewOf(d)
		msg := strings.Join(strings.Fields(v.Error), " ")
		if len(msg) > 160 {
			msg = msg[:157] + "..."
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%d\t%d\t%s\t%s\n", v.ID, v.EventID, v.StreamSeq,
			v.ParkedAt.UTC().Format(time.RFC3339), v.Attempts, v.Parked, v.State, msg)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "retry: baton group dead-letters retry %s ID... (or --all); give up: baton group dead-letters discard %s ID\n", groupName, groupName)
	return err
}

// credentialsInURL matches the user information of a URL in free text.
var credentialsInURL = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@`)

// redactErrorText hides the user information of any URL in an error's
// text (a webhook URL given with a user and password, say).
func redactErrorText(s string) string {
	return credentialsInURL.ReplaceAllString(s, "${1}redacted@")
}

type deadLettersRetryCmd struct {
	config.Database `embed:""`

	Group      string  `arg:"" enum:"audit,webhook" help:"Built-in group whose dead letters to retry: audit or webhook (another group's handler runs in its own service: retry there with (*group.Group).RetryDeadLetter, or replay it with baton replay --from-seq)."`
	IDs        []int64 `arg:"" optional:"" name:"id" help:"Ids of the dead letters to retry, as the list shows them."`
	All        bool    `name:"all" help:"Retry every unresolved dead letter of the group, oldest first."`
	groupFlags `embed:""`
}

func (c *deadLettersRetryCmd) Run(ctx context.Context, env *Env) error {
	if len(c.IDs) == 0 && !c.All {
		return &UsageError{Err: errors.New("give the ids of the dead letters to retry (baton group dead-letters list " + c.Group + " shows them), or --all")}
	}
	if len(c.IDs) > 0 && c.All {
		return &UsageError{Err: errors.New("give ids or --all, not both")}
	}
	cfg, err := c.groupConfig(c.Group, config.Stream{}.StreamConfig())
	if err != nil {
		return err
	}
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	ids := c.IDs
	if c.All {
		dead, err := schema.DeadLetters(ctx, pool, c.Group, false)
		if err != nil {
			return err
		}
		for _, d := range dead {
			ids = append(ids, d.ID)
		}
		if len(ids) == 0 {
			_, err := fmt.Fprintf(env.Stdout, "group %s has no unresolved dead letters\n", c.Group)
			return err
		}
	}
	g, err := newGroup(cfg, pool, nil, env.Log.With().Str("component", "group").Logger())
	if err != nil {
		return err
	}
	var failed int
	for _, id := range ids {
		outcome, err := g.RetryDeadLetter(ctx, id)
		switch {
		case err != nil:
			failed++
			fmt.Fprintf(env.Stdout, "dead letter %d: %s\n", id, redactErrorText(err.Error()))
		case outcome == group.OutcomeDuplicate:
			fmt.Fprintf(env.Stdout, "dead letter %d: the group had applied its event meanwhile; resolved\n", id)
		default:
			fmt.Fprintf(env.Stdout, "dead letter %d: applied; resolved\n", id)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d dead letters of group %s were not applied (they stay parked; fix the cause and retry)", failed, len(ids), c.Group)
	}
	return nil
}

type deadLettersDiscardCmd struct {
	config.Database `embed:""`

	Group string `arg:"" help:"Group whose dead letter to discard."`
	ID    int64  `arg:"" help:"Id of the dead letter, as the list shows it."`
}

func (c *deadLettersDiscardCmd) Run(ctx context.Context, env *Env) error {
	pool, err := openPool(ctx, c.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	var d schema.DeadLetter
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		d, err = schema.DiscardDeadLetterTx(ctx, tx, c.Group, c.ID)
		return err
	})
	if errors.Is(err, schema.ErrNotFound) || errors.Is(err, schema.ErrResolved) {
		return &ExitError{Code: 1, Err: err}
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(env.Stdout, "dead letter %s of group %s (event %s, stream sequence %d) discarded: it stays listed (--all) and is not applied again\n",
		strconv.FormatInt(d.ID, 10), c.Group, d.EventID, d.StreamSeq)
	return err
}
