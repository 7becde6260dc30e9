// Package events is the published format of the events Baton sends over
// NATS: one JSON Schema (draft 2020-12) per kind of event, in this folder
// and embedded here, and functions that check a message against them. Tests
// of any package call them to prove that what Baton emits is what the
// schemas promise; README.md in this folder describes the format.
package events

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The kinds of events; each has its schema in <kind>.schema.json.
const (
	// KindTrigger is an outbox event on the outbox stream.
	KindTrigger = "trigger"
	// KindConversationEvent is a committed change on the conversation
	// events stream.
	KindConversationEvent = "conversation-event"
	// KindLiveDelta is a step of a reply being written, on a live subject.
	KindLiveDelta = "live-delta"
)

// Kinds lists every kind of event.
func Kinds() []string {
	return []string{KindTrigger, KindConversationEvent, KindLiveDelta}
}

// ErrUnknownKind is returned, wrapped, for a kind that has no schema.
var ErrUnknownKind = errors.New("events: unknown kind of event")

//go:embed *.schema.json
var files embed.FS

// File returns the name of the schema file of kind.
func File(kind string) string { return kind + ".schema.json" }

// Schema returns the schema file of kind as it is published.
func Schema(kind string) ([]byte, error) {
	if !known(kind) {
		return nil, fmt.Errorf("%w %q: want one of %q", ErrUnknownKind, kind, Kinds())
	}
	return files.ReadFile(File(kind))
}

func known(kind string) bool {
	for _, k := range Kinds() {
		if k == kind {
			return true
		}
	}
	return false
}

// compiled holds, per kind, the schema of the body and the ones of its
// subject and headers ($defs/subject, $defs/headers).
type compiled struct {
	body, subject, headers *jsonschema.Schema
}

var (
	compileOnce sync.Once
	schemas     map[string]compiled
	compileErr  error
)

func compileAll() (map[string]compiled, error) {
	compileOnce.Do(func() {
		c := jsonschema.NewCompiler()
		// date-time is a promise of the format, not a hint.
		c.AssertFormat()
		out := make(map[string]compiled)
		for _, kind := range Kinds() {
			data, err := files.ReadFile(File(kind))
			if err != nil {
				compileErr = err
				return
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
			if err != nil {
				compileErr = fmt.Errorf("events: %s is not JSON: %w", File(kind), err)
				return
			}
			loc := "baton-events:///" + File(kind)
			if err := c.AddResource(loc, doc); err != nil {
				compileErr = err
				return
			}
			var s compiled
			for _, p := range []struct {
				into **jsonschema.Schema
				ptr  string
			}{{&s.body, ""}, {&s.subject, "#/$defs/subject"}, {&s.headers, "#/$defs/headers"}} {
				if *p.into, err = c.Compile(loc + p.ptr); err != nil {
					compileErr = fmt.Errorf("events: compile %s%s: %w", File(kind), p.ptr, err)
					return
				}
			}
			out[kind] = s
		}
		schemas = out
	})
	return schemas, compileErr
}

func schemaOf(kind string) (compiled, error) {
	all, err := compileAll()
	if err != nil {
		return compiled{}, err
	}
	s, ok := all[kind]
	if !ok {
		return compiled{}, fmt.Errorf("%w %q: want one of %q", ErrUnknownKind, kind, Kinds())
	}
	return s, nil
}

// Validate checks an event body against the schema of its kind.
func Validate(kind string, body []byte) error {
	s, err := schemaOf(kind)
	if err != nil {
		return err
	}
	if !utf8.Valid(body) {
		return fmt.Errorf("events: %s body is not UTF-8, as JSON text must be: %q", kind, body)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("events: %s body is not one JSON value: %w: %q", kind, err, body)
	}
	if err := s.body.Validate(doc); err != nil {
		return fmt.Errorf("events: %s body does not match %s: %w\nbody: %s", kind, File(kind), err, body)
	}
	return nil
}

// ValidateSubject checks the subject an event of kind was published on.
func ValidateSubject(kind, subject string) error {
	s, err := schemaOf(kind)
	if err != nil {
		return err
	}
	if err := s.subject.Validate(subject); err != nil {
		return fmt.Errorf("events: %s subject %q does not match %s#/$defs/subject: %w", kind, subject, File(kind), err)
	}
	return nil
}

// ValidateHeader checks the headers of an event of kind; a nats.Header is a
// map[string][]string. Each header must have one value.
func ValidateHeader(kind string, header map[string][]string) error {
	s, err := schemaOf(kind)
	if err != nil {
		return err
	}
	doc := make(map[string]any, len(header))
	for name, values := range header {
		if len(values) != 1 {
			return fmt.Errorf("events: %s header %s has %d values %q: want one", kind, name, len(values), values)
		}
		doc[name] = values[0]
	}
	if err := s.headers.Validate(doc); err != nil {
		return fmt.Errorf("events: %s headers %q do not match %s#/$defs/headers: %w", kind, header, File(kind), err)
	}
	return nil
}

// ValidateMessage checks the subject, headers and body of an event of kind
// as a subscriber receives them.
func ValidateMessage(kind, subject string, header map[string][]string, body []byte) error {
	return errors.Join(ValidateSubject(kind, subject), ValidateHeader(kind, header), Validate(kind, body))
}
