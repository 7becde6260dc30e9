// Package setting is the error a configuration returns for a setting that
// cannot work, shared by every library configuration in Baton (the
// stream, the turn runner, groups, the relay, the agent) so that a command
// line can name the flag and the variable behind the field, and a library
// caller can find the field, without either parsing messages.
package setting

import "fmt"

// Error is one setting that cannot work: the field of the configuration,
// the value it was given and what is wrong with it, in the way of
// litestream's ConfigValidationError. A secret's value is never put in
// Value.
type Error struct {
	// Field is the setting's path in its configuration, such as "Lease"
	// or "Consumer.AckWait".
	Field string
	// Value is what the field was given.
	Value any
	// Problem says what is wrong and how to fix it.
	Problem string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %v: %s", e.Field, e.Value, e.Problem)
}

// Errorf returns an *Error for field with the given value and a problem
// formatted from format and args.
func Errorf(field string, value any, format string, args ...any) *Error {
	return &Error{Field: field, Value: value, Problem: fmt.Sprintf(format, args...)}
}

// Within returns err with prefix and a dot put before its Field when it is
// an *Error, so that a nested configuration's error names the whole path
// ("Stream.Replicas"); any other error comes back unchanged.
func Within(prefix string, err error) error {
	if e, ok := err.(*Error); ok {
		c := *e
		c.Field = prefix + "." + c.Field
		return &c
	}
	return err
}
