package schema

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
)

// ErrBadCursor: a cursor that is not one this conversation gave.
var ErrBadCursor = errors.New("not a cursor of this conversation")

// Cursor is a position in the conversation's messages (the seq of the
// message a page ends at) as its client holds it: encrypted under a key
// of the conversation's secret salt, so that it says nothing of other
// conversations (the seq counts the messages of the whole server), and a
// cursor of one conversation means nothing in another.
func (c Conversation) Cursor(seq int64) string {
	var block [aes.BlockSize]byte
	binary.BigEndian.PutUint64(block[:8], uint64(seq))
	c.cipher().Encrypt(block[:], block[:])
	return base64.RawURLEncoding.EncodeToString(block[:])
}

// Position is the seq that a cursor of the conversation holds, or
// ErrBadCursor.
func (c Conversation) Position(cursor string) (int64, error) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || len(raw) != aes.BlockSize {
		return 0, ErrBadCursor
	}
	c.cipher().Decrypt(raw, raw)
	for _, b := range raw[8:] {
		if b != 0 {
			return 0, ErrBadCursor
		}
	}
	seq := int64(binary.BigEndian.Uint64(raw[:8]))
	if seq < 0 {
		return 0, ErrBadCursor
	}
	return seq, nil
}

// cipher is the conversation's cursor key: AES-128 keyed by a hash of its
// salt, a single block per cursor (the seq, then zeros that a decrypted
// cursor must show).
func (c Conversation) cipher() cipher.Block {
	sum := sha256.Sum256(append([]byte("baton cursor\x00"), c.Salt...))
	b, err := aes.NewCipher(sum[:16])
	if err != nil {
		panic(err) // a 16-byte key is always valid
	}
	return b
}
