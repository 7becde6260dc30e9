package schema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Attachments (migration 00029). A user message may carry files; their
// bytes leave the message in the producer function, before its outbox
// row, into a content-addressed store per owner (the sha256 of the
// bytes), and the message keeps references. Every policy (FileLimits) is
// held by the producer function, for every write path alike.

// Defaults of FileLimits: what the SQL producer applies, and the API
// unless its settings say otherwise.
const (
	// DefaultMaxFileBytes is the largest file: 5 MiB.
	DefaultMaxFileBytes = 5 << 20
	// DefaultMaxFiles is the most files of one message.
	DefaultMaxFiles = 4
	// DefaultMaxUserFileBytes is what one user's files may take together:
	// 1 GiB. Identical files count once.
	DefaultMaxUserFileBytes = 1 << 30
)

// DefaultFileMediaTypes are the media types taken by default: images,
// PDF and plain text. "image/*" takes every image type the store knows.
var DefaultFileMediaTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf", "text/plain"}

// SniffedMediaTypes are the media types the store finds in the bytes
// (baton_sniff_media_type, after Go's net/http.DetectContentType); any
// other bytes are application/octet-stream.
var SniffedMediaTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf", "text/plain", "application/octet-stream"}

// FileLimits are the policies of a message's files.
type FileLimits struct {
	// MaxFileBytes is the largest file, in bytes. Defaults to
	// DefaultMaxFileBytes.
	MaxFileBytes int64
	// MaxFiles is the most files a message may carry. Defaults to
	// DefaultMaxFiles.
	MaxFiles int
	// MaxUserBytes is what one user's files may take together, each
	// distinct file counted once; negative turns the quota off. Defaults to
	// DefaultMaxUserFileBytes.
	MaxUserBytes int64
	// MediaTypes are the media types taken, as found in the bytes (see
	// SniffedMediaTypes); "image/*" takes every image type. Defaults to
	// DefaultFileMediaTypes.
	MediaTypes []string
}

// WithDefaults returns a copy with every zero field set to its default.
func (l FileLimits) WithDefaults() FileLimits {
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = DefaultMaxFileBytes
	}
	if l.MaxFiles == 0 {
		l.MaxFiles = DefaultMaxFiles
	}
	if l.MaxUserBytes == 0 {
		l.MaxUserBytes = DefaultMaxUserFileBytes
	}
	if len(l.MediaTypes) == 0 {
		l.MediaTypes = DefaultFileMediaTypes
	}
	return l
}

// CheckMediaType returns an error that says what to give when t is not a
// media type the store can find in bytes.
func CheckMediaType(t string) error {
	for _, k := range SniffedMediaTypes {
		if t == k || t == strings.Split(k, "/")[0]+"/*" {
			return nil
		}
	}
	return fmt.Errorf("%q is not a media type found in files' bytes: give some of %s, or image/*", t, strings.Join(SniffedMediaTypes, ", "))
}

// sqlLimits is l as the producer function takes it.
func (l FileLimits) sqlLimits() map[string]any {
	l = l.WithDefaults()
	return map[string]any{"max_file_bytes": l.MaxFileBytes, "max_files": l.MaxFiles, "max_user_bytes": l.MaxUserBytes, "media_types": l.MediaTypes}
}

// FileIn is a file of a message a producer writes: its bytes, or the
// sha256 of a file of the owner's sent before (Data nil).
type FileIn struct {
	// Filename is the name the client gave, at most 255 characters; it is
	// shown and served sanitized.
	Filename string
	// MediaType is the declared media type; the bytes must agree with it
	// (an empty one, or application/octet-stream, takes what they are).
	MediaType string
	// Data are the bytes.
	Data []byte
	// SHA256 names a file of the owner's sent before, in hex, when Data
	// is nil.
	SHA256 string
}

// File is a file of a message, as the message keeps it: a reference.
type File struct {
	// SHA256 is the sha256 of the bytes, in hex: the file's address in its
	// owner's store.
	SHA256 string `json:"sha256"`
	// MediaType is the media type found in the bytes.
	MediaType string `json:"media_type"`
	// Filename is the name the client gave, as it gave it.
	Filename string `json:"filename"`
	// Size is the number of bytes.
	Size int64 `json:"size"`
	// URL is a signed link to the bytes; the API sets it.
	URL string `json:"url,omitempty"`
	// Owner is the owner whose store holds the bytes.
	Owner int64 `json:"-"`
}

// Errors of a message's files, each a *ProducerError of its SQLSTATE, and
// nothing written.
var (
	// ErrFileTooLarge: a file is over FileLimits.MaxFileBytes (PB020).
	ErrFileTooLarge = errors.New("file too large")
	// ErrTooManyFiles: more files than FileLimits.MaxFiles (PB021).
	ErrTooManyFiles = errors.New("too many files")
	// ErrFileQuota: the user's files would take more than
	// FileLimits.MaxUserBytes (PB022).
	ErrFileQuota = errors.New("file quota exceeded")
	// ErrMediaType: the bytes are of a media type not taken (PB023), or
	// not of the declared one (PB024).
	ErrMediaType = errors.New("media type not taken")
	// ErrBadFile: a file is empty, malformed, or names no file of the
	// owner's (PB025, PB026).
	ErrBadFile = errors.New("bad file")
)

// SQLSTATEs of a message's files.
const (
	SQLStateFileTooLarge      = "PB020"
	SQLStateTooManyFiles      = "PB021"
	SQLStateFileQuota         = "PB022"
	SQLStateMediaTypeRefused  = "PB023"
	SQLStateMediaTypeMismatch = "PB024"
	SQLStateBadFile           = "PB025"
	SQLStateUnknownFile       = "PB026"
)

// fileArgs are files as the producer function takes them: their metadata
// as JSON, their bytes apart (nil for a reference).
func fileArgs(files []FileIn) (meta []map[string]string, data [][]byte) {
	if len(files) == 0 {
		return nil, nil
	}
	meta = make([]map[string]string, len(files))
	data = make([][]byte, len(files))
	for i, f := range files {
		meta[i] = map[string]string{"filename": f.Filename, "media_type": f.MediaType}
		if f.Data == nil {
			meta[i]["sha256"] = f.SHA256
		}
		data[i] = f.Data
	}
	return meta, data
}

// FileStore is where the bytes of files live. The files table always
// holds each file's owner, sha256, media type and size, which the quota,
// the deduplication and the references use; a store holds the bytes.
//
// PostgresFiles, the default, keeps them in the files table, written in
// the message's transaction by the producer function. A store outside
// PostgreSQL (an S3-compatible bucket, keyed by owner and sha256) would
// Put the checked bytes before the message's transaction (a put of the
// same key is idempotent, so a retried or refused message costs at most
// an object that the next prune removes), have the producer function
// record the file without bytes, serve them by Open, and remove the
// objects whose rows the cleanup removed.
type FileStore interface {
	// Open returns the bytes of owner's file sum, or ErrNotFound.
	Open(ctx context.Context, db Executor, owner int64, sum string) (StoredFile, error)
}

// StoredFile is a file with its bytes.
type StoredFile struct {
	MediaType string
	Size      int64
	Data      []byte
}

// PostgresFiles keeps the bytes of files in PostgreSQL, in the files
// table.
type PostgresFiles struct{}

// Open implements FileStore.
func (PostgresFiles) Open(ctx context.Context, db Executor, owner int64, sum string) (StoredFile, error) {
	var f StoredFile
	err := db.QueryRow(ctx, `SELECT media_type, size, data FROM files WHERE owner_id = $1 AND sha256 = $2 AND data IS NOT NULL`,
		owner, sum).Scan(&f.MediaType, &f.Size, &f.Data)
	if errors.Is(err, pgx.ErrNoRows) {
		return f, ErrNotFound
	}
	if err != nil {
		return f, fmt.Errorf("open file: %w", err)
	}
	return f, nil
}

// FilesOf returns the files of the messages of the given keys (the
// server's ids), in order, by message.
func FilesOf(ctx context.Context, db Executor, messageKeys []string) (map[string][]File, error) {
	if len(messageKeys) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, `
		SELECT mf.message_id, mf.sha256, f.media_type, mf.filename, f.size, mf.owner_id
		FROM message_files mf JOIN files f ON f.owner_id = mf.owner_id AND f.sha256 = mf.sha256
		WHERE mf.message_id = ANY($1)
		ORDER BY mf.message_id, mf.position`, messageKeys)
	if err != nil {
		return nil, fmt.Errorf("files of messages: %w", err)
	}
	defer rows.Close()
	out := map[string][]File{}
	for rows.Next() {
		var key string
		var f File
		if err := rows.Scan(&key, &f.SHA256, &f.MediaType, &f.Filename, &f.Size, &f.Owner); err != nil {
			return nil, fmt.Errorf("files of messages: %w", err)
		}
		out[key] = append(out[key], f)
	}
	return out, rows.Err()
}

// PruneFiles removes the files that no message references, for up to
// owners owners, and returns how many it removed. Deleting a
// conversation removes the files only its messages referenced in the
// same transaction (a trigger); this sweep is prune's safety net.
func PruneFiles(ctx context.Context, db Executor, owners int) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT baton_prune_files($1)`, owners).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune files: %w", err)
	}
	return n, nil
}

// FileUsage returns the bytes owner's files take, each distinct file
// counted once.
func FileUsage(ctx context.Context, db Executor, owner int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT coalesce((SELECT bytes FROM file_usage WHERE owner_id = $1), 0)`, owner).Scan(&n)
	return n, err
}

// OpenMessageFile returns the bytes of the file sum of the message of the
// given key (the server's id), from store: what a worker sends a model.
func OpenMessageFile(ctx context.Context, db Executor, store FileStore, messageKey, sum string) (StoredFile, error) {
	owner, err := MessageFileOwner(ctx, db, messageKey, sum)
	if err != nil {
		return StoredFile{}, err
	}
	return store.Open(ctx, db, owner, sum)
}

// MessageFileOwner returns the owner of the file sum of the message of
// the given key, or ErrNotFound when the message has no such file.
func MessageFileOwner(ctx context.Context, db Executor, messageKey, sum string) (int64, error) {
	var owner int64
	err := db.QueryRow(ctx, `SELECT owner_id FROM message_files WHERE message_id = $1 AND sha256 = $2 LIMIT 1`, messageKey, sum).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("the owner of a message's file: %w", err)
	}
	return owner, nil
}
