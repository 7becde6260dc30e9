package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/schema"
)

// Attachments: a message's files come as useChat's file parts
// ({type: "file", mediaType, url, filename}, url a data URL) or in the
// "files" of POST /v1/conversations/{cid}/messages, in the same shape.
// The API decodes the bytes and hands them to the producer, which holds
// every policy (schema.FileLimits) and stores them before the outbox row;
// it never fetches a URL. A file sent before is named by its link
// (/v1/files/{sha256}, as the history gives it), which the producer
// matches to the owner's file without bytes.

// DefaultFileLinkTTL is how long a signed link to a file works.
const DefaultFileLinkTTL = time.Hour

// fileIn is a file of a request: useChat's file part, or an element of
// the "files" of a REST message.
type fileIn struct {
	Type      string `json:"type"`
	MediaType string `json:"mediaType"`
	// MediaTypeSnake is "media_type", as the REST API spells fields.
	MediaTypeSnake string `json:"media_type"`
	Filename       string `json:"filename"`
	URL            string `json:"url"`
}

// fileError is a file the API refuses before the producer sees it.
type fileError struct {
	code    string
	message string
}

func (e *fileError) Error() string { return e.message }

// fileLinkPath matches a link to a file of Baton's, absolute or not.
var fileLinkPath = regexp.MustCompile(`^(?:https?://[^/?#]+)?/v1/files/([0-9a-f]{64})(?:\?.*)?$`)

// decodeFiles turns a request's files into the producer's: a data URL's
// bytes, or a link to a file sent before by its sha256.
func decodeFiles(in []fileIn) ([]schema.FileIn, error) {
	out := make([]schema.FileIn, 0, len(in))
	for i, f := range in {
		n := i + 1
		if f.Type != "" && f.Type != "file" {
			return nil, &fileError{"bad_file", fmt.Sprintf("file %d has type %q: a file part's type is \"file\"", n, f.Type)}
		}
		mediaType := f.MediaType
		if mediaType == "" {
			mediaType = f.MediaTypeSnake
		}
		file := schema.FileIn{Filename: f.Filename, MediaType: mediaType}
		switch {
		case strings.HasPrefix(f.URL, "data:"):
			header, payload, ok := strings.Cut(f.URL[len("data:"):], ",")
			if !ok || !strings.HasSuffix(header, ";base64") {
				return nil, &fileError{"bad_file", fmt.Sprintf("file %d's url is a data URL without base64 bytes: send data:<media type>;base64,<bytes>, as the AI SDK does", n)}
			}
			data, err := base64.StdEncoding.DecodeString(payload)
			if err != nil {
				return nil, &fileError{"bad_file", fmt.Sprintf("file %d's data URL does not hold base64: %v", n, err)}
			}
			if file.MediaType == "" {
				file.MediaType, _, _ = strings.Cut(strings.TrimSuffix(header, ";base64"), ";")
			}
			if data == nil {
				data = []byte{}
			}
			file.Data = data
		case fileLinkPath.MatchString(f.URL):
			file.SHA256 = fileLinkPath.FindStringSubmatch(f.URL)[1]
		case f.URL == "":
			return nil, &fileError{"bad_file", fmt.Sprintf("file %d has no url: send its bytes as a data URL", n)}
		default:
			return nil, &fileError{"file_url_refused", fmt.Sprintf("file %d's url is not a data URL: Baton never fetches URLs, send the bytes as data:<media type>;base64,<bytes>", n)}
		}
		out = append(out, file)
	}
	return out, nil
}

// fileRoom is what a message's files may add to a request's body at the
// limits: each file's bytes in base64, with its name and media type.
func (c Config) fileRoom() int64 {
	return int64(c.MaxFilesPerMessage) * ((c.MaxFileBytes+2)/3*4 + 2048)
}

// fileLimits are the producer's policies from the settings.
func (c Config) fileLimits() schema.FileLimits {
	return schema.FileLimits{MaxFileBytes: c.MaxFileBytes, MaxFiles: c.MaxFilesPerMessage, MaxUserBytes: c.MaxUserFileBytes, MediaTypes: c.FileMediaTypes}
}

// fileRefused answers a message whose files were refused, by the API or
// the producer, and reports whether err was that. Nothing was written.
func fileRefused(w http.ResponseWriter, err error) bool {
	var fe *fileError
	if errors.As(err, &fe) {
		writeError(w, http.StatusUnprocessableEntity, fe.code, fe.message)
		return true
	}
	var pe *schema.ProducerError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case schema.SQLStateFileTooLarge:
		writeError(w, http.StatusRequestEntityTooLarge, "file_too_large", pe.Message+" (--max-file-bytes)")
	case schema.SQLStateTooManyFiles:
		writeError(w, http.StatusRequestEntityTooLarge, "too_many_files", pe.Message+" (--max-files-per-message)")
	case schema.SQLStateFileQuota:
		writeError(w, http.StatusRequestEntityTooLarge, "file_quota_exceeded", pe.Message+" (--max-user-file-bytes)")
	case schema.SQLStateMediaTypeRefused:
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", pe.Message+" (--file-media-types)")
	case schema.SQLStateMediaTypeMismatch:
		writeError(w, http.StatusUnsupportedMediaType, "media_type_mismatch", pe.Message)
	case schema.SQLStateBadFile:
		writeError(w, http.StatusUnprocessableEntity, "bad_file", pe.Message)
	case schema.SQLStateUnknownFile:
		writeError(w, http.StatusUnprocessableEntity, "unknown_file", pe.Message)
	default:
		return false
	}
	return true
}

// fileLinks signs and checks the links to files, with the key the
// database keeps, read once.
type fileLinks struct {
	mu    sync.Mutex
	links *schema.FileLinks
}

func (s *Server) links(ctx context.Context) (*schema.FileLinks, error) {
	s.fileLinks.mu.Lock()
	defer s.fileLinks.mu.Unlock()
	if s.fileLinks.links == nil {
		l, err := schema.LoadFileLinks(ctx, s.pool)
		if err != nil {
			return nil, err
		}
		s.fileLinks.links = l
	}
	return s.fileLinks.links, nil
}

// origin is the scheme and host the client reached the API at, which a
// link to a file starts with (a page of another origin shows it too).
func origin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// signFiles sets each file's URL to a signed link that works without a
// bearer token for the file link TTL.
func (s *Server) signFiles(r *http.Request, files []schema.File) error {
	if len(files) == 0 {
		return nil
	}
	l, err := s.links(r.Context())
	if err != nil {
		return err
	}
	expires := time.Now().Add(s.cfg.FileLinkTTL)
	base := origin(r)
	for i := range files {
		f := &files[i]
		f.URL = base + "/v1/files/" + f.SHA256 + "?" + l.Query(f.Owner, f.SHA256, expires)
		if f.Filename != "" {
			f.URL += "&name=" + url.QueryEscape(f.Filename)
		}
	}
	return nil
}

// getFile serves a file to its owner: with the owner's bearer token, or
// with a signed link (u, e, s), which <img> can load. Any other user's
// file, or one that is gone, is 404.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	sum := r.PathValue("sha256")
	if !fileSum.MatchString(sum) {
		writeError(w, http.StatusNotFound, "not_found", "no such file: a file's address is the sha256 of its bytes, 64 lowercase hex digits")
		return
	}
	q := r.URL.Query()
	if q.Get("s") == "" {
		s.auth(func(w http.ResponseWriter, r *http.Request) { s.serveFile(w, r, userFrom(r.Context()).ID, sum) })(w, r)
		return
	}
	l, err := s.links(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	owner, err := l.Owner(q, sum, time.Now())
	if err != nil {
		writeError(w, http.StatusForbidden, "bad_link", "the link is not valid or has expired: read the history again for a new one")
		return
	}
	s.serveFile(w, r, owner, sum)
}

var fileSum = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (s *Server) serveFile(w http.ResponseWriter, r *http.Request, owner int64, sum string) {
	f, err := s.cfg.FileStore.Open(r.Context(), s.pool, owner, sum)
	if errors.Is(err, schema.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", "no such file for this user")
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	mediaType := f.MediaType
	if mediaType == "text/plain" {
		mediaType = "text/plain; charset=utf-8"
	}
	h := w.Header()
	h.Set("Content-Type", mediaType)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Disposition", contentDisposition(r.URL.Query().Get("name")))
	if f.MediaType != "application/pdf" {
		// Nothing a file holds runs on the API's origin, opened on its
		// own. (A browser's PDF viewer does not work sandboxed.)
		h.Set("Content-Security-Policy", "default-src 'none'; sandbox")
	}
	h.Set("Cache-Control", "private, max-age=300")
	h.Set("ETag", `"`+sum+`"`)
	h.Set("Content-Length", strconv.FormatInt(int64(len(f.Data)), 10))
	if r.Header.Get("If-None-Match") == `"`+sum+`"` {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(f.Data)
	}
}

// contentDisposition is an inline disposition with name made safe for a
// header and a file system: letters, digits, '.', '-', '_' and spaces
// only, at most 100 characters, never a leading dot.
func contentDisposition(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_', r == ' ':
			b.WriteRune(r)
		default:
			b.WriteRune('_')
		}
		if b.Len() >= 100 {
			break
		}
	}
	safe := strings.TrimLeft(strings.TrimSpace(b.String()), ".")
	if safe == "" {
		safe = "file"
	}
	return `inline; filename="` + safe + `"`
}
