package schema

import (
	"context"
	"crypto/aes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// FileLinks signs and checks the links to GET /v1/files/{sha256} that
// work without a bearer token: what a chat's history gives <img> (which
// cannot send one) and what an external agent is given. A link names the
// file, its owner (encrypted: the link says nothing of how many users
// there are) and its expiry, and is signed with HMAC-SHA256 under the key
// of migration 00029 (file_link_key), which the API and the worker read
// and nobody is shown.
type FileLinks struct {
	mac   []byte
	owner []byte
}

// ErrBadLink: a link that is not signed with the key, or has expired.
var ErrBadLink = errors.New("the link is not valid or has expired")

// LoadFileLinks reads the links' key.
func LoadFileLinks(ctx context.Context, db Executor) (*FileLinks, error) {
	var key []byte
	if err := db.QueryRow(ctx, `SELECT key FROM file_link_key`).Scan(&key); err != nil {
		return nil, fmt.Errorf("read the key of file links: %w", err)
	}
	return NewFileLinks(key), nil
}

// NewFileLinks returns the links of key.
func NewFileLinks(key []byte) *FileLinks {
	derive := func(label string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(label))
		return h.Sum(nil)
	}
	return &FileLinks{mac: derive("baton file link signature"), owner: derive("baton file link owner")[:16]}
}

// Query returns the query of a link to owner's file sum that works until
// expires: "u=<owner>&e=<unix seconds>&s=<signature>".
func (l *FileLinks) Query(owner int64, sum string, expires time.Time) string {
	var block [16]byte
	binary.BigEndian.PutUint64(block[8:], uint64(owner))
	c, _ := aes.NewCipher(l.owner) // 16 bytes: never fails
	c.Encrypt(block[:], block[:])
	u := base64.RawURLEncoding.EncodeToString(block[:])
	e := strconv.FormatInt(expires.Unix(), 10)
	return url.Values{"u": {u}, "e": {e}, "s": {l.sign(u, sum, e)}}.Encode()
}

func (l *FileLinks) sign(u, sum, e string) string {
	h := hmac.New(sha256.New, l.mac)
	h.Write([]byte(u + "\x00" + sum + "\x00" + e))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// Owner checks the query of a link to file sum at now, and returns the
// owner it was signed for; ErrBadLink when it is not signed, or has
// expired.
func (l *FileLinks) Owner(q url.Values, sum string, now time.Time) (int64, error) {
	u, e, s := q.Get("u"), q.Get("e"), q.Get("s")
	if subtle.ConstantTimeCompare([]byte(l.sign(u, sum, e)), []byte(s)) != 1 {
		return 0, ErrBadLink
	}
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil || now.Unix() > exp {
		return 0, ErrBadLink
	}
	block, err := base64.RawURLEncoding.DecodeString(u)
	if err != nil || len(block) != 16 {
		return 0, ErrBadLink
	}
	c, _ := aes.NewCipher(l.owner)
	c.Decrypt(block, block)
	return int64(binary.BigEndian.Uint64(block[8:])), nil
}
