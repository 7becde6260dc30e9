// Package nats holds what Baton's relay and consumers agree on about NATS
// JetStream: the outbox stream and its settings, the subject of a
// conversation, the trigger events, and an embedded server for development
// and tests.
package nats

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A conversation ID may hold characters that NATS subjects forbid ('.',
// '*', '>', whitespace) or any other Unicode. The token is the ID in
// unpadded base64url, whose alphabet (A-Z a-z 0-9 - _) is always one valid
// subject token, and which decodes back to the exact ID.
var tokenEncoding = base64.RawURLEncoding

// EncodeToken turns a conversation ID into one valid subject token.
func EncodeToken(conversationID string) string {
	return tokenEncoding.EncodeToString([]byte(conversationID))
}

// DecodeToken reverses EncodeToken.
func DecodeToken(token string) (string, error) {
	b, err := tokenEncoding.DecodeString(token)
	if err != nil {
		return "", fmt.Errorf("nats: subject token %q is not a conversation token: %w", token, err)
	}
	return string(b), nil
}

// Hash is the 32-bit FNV-1a hash of s, computed without allocating: the
// one hash behind partitions and every other split of work by
// conversation, so that all of them agree.
func Hash(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// Partition is a stable hash (Hash) of the conversation ID over count
// partitions. Changing count moves conversations between partitions, which
// is safe (the Postgres claim, not the partition, serializes turns) but
// loses affinity until in-flight triggers drain.
func Partition(conversationID string, count int) int {
	if count <= 1 {
		return 0
	}
	return int(Hash(conversationID) % uint32(count))
}

// Subject returns "<prefix>.<partition>.<token>" for a conversation.
func Subject(prefix string, partitions int, conversationID string) string {
	return prefix + "." + strconv.Itoa(Partition(conversationID, partitions)) + "." + EncodeToken(conversationID)
}

// ParseSubject returns the partition and conversation ID of an event subject.
func ParseSubject(prefix, subject string) (partition int, conversationID string, err error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return 0, "", fmt.Errorf("nats: subject %q is not under prefix %q", subject, prefix)
	}
	p, token, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(token, ".") {
		return 0, "", fmt.Errorf("nats: subject %q is not <prefix>.<partition>.<token>", subject)
	}
	partition, err = strconv.Atoi(p)
	if err != nil || partition < 0 {
		return 0, "", fmt.Errorf("nats: subject %q has no partition number", subject)
	}
	conversationID, err = DecodeToken(token)
	return partition, conversationID, err
}

// ValidatePrefix checks a subject prefix: dot-separated tokens without
// wildcards or whitespace.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return errors.New("subject prefix is empty")
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("subject prefix %q is not valid: use dot-separated tokens without '*', '>' or spaces, such as baton.outbox", prefix)
		}
	}
	return nil
}
