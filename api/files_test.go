package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// pngOf returns a PNG of w×h pixels of noise drawn from seed: two seeds
// give two different files, of about 4 bytes a pixel (noise does not
// compress).
func pngOf(t testing.TB, w, h int, seed byte) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	for x := range w {
		for y := range h {
			img.Set(x, y, color.RGBA{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), 255})
		}
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return buf.Bytes()
}

func dataURL(mediaType string, b []byte) string {
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(b)
}

func sumOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// fileCounts returns the rows every write of a message touches, files
// included.
func fileCounts(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	var c, m, o, f, mf int
	var used int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM conversations), (SELECT count(*) FROM messages), (SELECT count(*) FROM agent_outbox),
		(SELECT count(*) FROM files), (SELECT count(*) FROM message_files), (SELECT coalesce(sum(bytes), 0) FROM file_usage)`).Scan(&c, &m, &o, &f, &mf, &used))
	return fmt.Sprintf("%d conversations, %d messages, %d outbox rows, %d files, %d references, %d bytes in use", c, m, o, f, mf, used)
}

func setupFiles(t *testing.T, cfg api.Config) *bundle {
	t.Helper()
	db := testenv.Database(t)
	ctx := context.Background()
	a, alice, err := schema.CreateToken(ctx, db.Pool, "alice")
	require.NoError(t, err)
	b, _, err := schema.CreateToken(ctx, db.Pool, "bob")
	require.NoError(t, err)
	s, err := api.New(cfg, db.Pool, nil)
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return &bundle{pool: db.Pool, srv: hs, alice: a, bob: b, aliceID: alice.ID, client: hs.Client()}
}

// get fetches an absolute URL without a token.
func get(t *testing.T, client *http.Client, u string) (*http.Response, []byte) {
	t.Helper()
	resp, err := client.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

// TestAMessageKeepsAReferenceAndItsFileIsServedByASignedLink: an image
// sent with a REST message is stored apart, once, under its sha256; the
// message keeps a reference (its content is the text alone, and no
// column of messages or agent_outbox holds the bytes); the message list
// gives a signed link that serves the bytes without a bearer token, with
// the media type found in them, nosniff and a sanitized file name.
func TestAMessageKeepsAReferenceAndItsFileIsServedByASignedLink(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, api.Config{})
	b.createConversation(t, b.alice, "c1")
	img := pngOf(t, 32, 32, 1)
	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1", "content": "what is this?",
		"files": []map[string]any{{"type": "file", "mediaType": "image/png", "filename": "../../etc/pass\"wd\r\n.png", "url": dataURL("image/png", img)}}})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)

	var content string
	var rowBytes int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT m.content, octet_length(row_to_json(m)::text) + octet_length(row_to_json(o)::text)
		FROM messages m JOIN agent_outbox o ON o.message_id = m.id WHERE m.public_id = 'm1'`).Scan(&content, &rowBytes))
	require.Equal(t, "what is this?", content, "the message keeps its text; the bytes are elsewhere")
	require.Less(t, rowBytes, len(img), "the message and outbox rows hold no bytes of the file")
	var stored []byte
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT data FROM files WHERE sha256 = $1`, sumOf(img)).Scan(&stored))
	require.Equal(t, img, stored)

	list := b.do(t, b.alice, "GET", convPath("c1", "/messages"), nil)
	require.Equal(t, http.StatusOK, list.Status, list.Raw)
	files := list.Body["messages"].([]any)[0].(map[string]any)["files"].([]any)
	require.Len(t, files, 1)
	f := files[0].(map[string]any)
	require.Equal(t, sumOf(img), f["sha256"])
	require.Equal(t, "image/png", f["media_type"])
	link := f["url"].(string)
	require.True(t, strings.HasPrefix(link, b.srv.URL+"/v1/files/"+sumOf(img)+"?"), link)

	resp, body := get(t, b.client, link)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Equal(t, img, body)
	require.Equal(t, "image/png", resp.Header.Get("Content-Type"))
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	require.Equal(t, `inline; filename="_.._etc_pass_wd__.png"`, resp.Header.Get("Content-Disposition"))
	require.Equal(t, "default-src 'none'; sandbox", resp.Header.Get("Content-Security-Policy"))

	resp, _ = get(t, b.client, strings.Replace(link, "&s=", "&s=x", 1))
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a link whose signature was changed is refused")
}

// TestAnotherUserGets404ForAFile: a file is its owner's: another user's
// bearer token finds nothing at its address, and an unknown address is
// 404 for its owner too.
func TestAnotherUserGets404ForAFile(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, api.Config{})
	b.createConversation(t, b.alice, "c1")
	img := pngOf(t, 4, 4, 2)
	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1",
		"files": []map[string]any{{"media_type": "image/png", "filename": "a.png", "url": dataURL("image/png", img)}}})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)

	own := b.do(t, b.alice, "GET", "/v1/files/"+sumOf(img), nil)
	require.Equal(t, http.StatusOK, own.Status)
	require.Equal(t, string(img), own.Raw)
	other := b.do(t, b.bob, "GET", "/v1/files/"+sumOf(img), nil)
	require.Equal(t, http.StatusNotFound, other.Status, other.Raw)
	none := b.do(t, b.alice, "GET", "/v1/files/"+sumOf([]byte("nothing")), nil)
	require.Equal(t, http.StatusNotFound, none.Status, none.Raw)
	anon := b.do(t, "", "GET", "/v1/files/"+sumOf(img), nil)
	require.Equal(t, http.StatusUnauthorized, anon.Status, "without a token or a signed link: 401")
}

// TestFilePoliciesAnswerAsDocumentedAndWriteNothing: each limit and each
// policy of files answers its documented status and code, and writes
// nothing: bytes per file (413), files per message (413), the user's
// quota (413), media types found in the bytes (415), a declared type the
// bytes contradict (415), a URL that is not a data URL (422: the API never
// fetches one), bytes that are not base64 and a reference to no file of
// the user's (422).
func TestFilePoliciesAnswerAsDocumentedAndWriteNothing(t *testing.T) {
	t.Parallel()
	small := pngOf(t, 4, 4, 3)
	first := pngOf(t, 20, 20, 4)
	overQuota := pngOf(t, 24, 24, 5)
	maxFile := len(overQuota) + 100
	b := setupFiles(t, api.Config{MaxFileBytes: int64(maxFile), MaxFilesPerMessage: 2, MaxUserFileBytes: int64(len(first) + len(overQuota) - 1),
		FileMediaTypes: []string{"image/*", "text/plain"}})
	b.createConversation(t, b.alice, "c1")
	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m0",
		"files": []map[string]any{{"mediaType": "image/png", "url": dataURL("image/png", first)}}})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	before := fileCounts(t, b.pool)

	file := func(mediaType string, data []byte) map[string]any {
		return map[string]any{"mediaType": mediaType, "filename": "f", "url": dataURL(mediaType, data)}
	}
	for _, tc := range []struct {
		what   string
		files  []map[string]any
		status int
		code   string
	}{
		{"a file over --max-file-bytes", []map[string]any{file("image/png", pngOf(t, 30, 30, 6))}, 413, "file_too_large"},
		{"more files than --max-files-per-message", []map[string]any{file("image/png", small), file("image/png", small), file("image/png", small)}, 413, "too_many_files"},
		{"files past the user's quota", []map[string]any{file("image/png", overQuota)}, 413, "file_quota_exceeded"},
		{"a PDF, which --file-media-types leaves out", []map[string]any{file("application/pdf", []byte("%PDF-1.4\n%%EOF\n"))}, 415, "unsupported_media_type"},
		{"binary bytes declared as text", []map[string]any{file("text/plain", []byte{0x7f, 'E', 'L', 'F', 0, 1, 2})}, 415, "unsupported_media_type"},
		{"text declared as an image", []map[string]any{file("image/png", []byte("not an image"))}, 415, "media_type_mismatch"},
		{"an https URL", []map[string]any{{"mediaType": "image/png", "url": "https://example.com/cat.png"}}, 422, "file_url_refused"},
		{"a data URL that is not base64", []map[string]any{{"mediaType": "image/png", "url": "data:image/png;base64,%%%"}}, 422, "bad_file"},
		{"a link to a file the user does not have", []map[string]any{{"mediaType": "image/png", "url": "/v1/files/" + sumOf([]byte("x"))}}, 422, "unknown_file"},
	} {
		r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1", "content": "look", "files": tc.files})
		require.Equal(t, tc.status, r.Status, "%s: %s", tc.what, r.Raw)
		require.Equal(t, tc.code, r.Body["error"].(map[string]any)["code"], tc.what)
		require.Equal(t, before, fileCounts(t, b.pool), "%s writes nothing", tc.what)
	}

	// A file sent before, named by its link, is matched without bytes.
	r = b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m2", "content": "again",
		"files": []map[string]any{{"mediaType": "image/png", "url": b.srv.URL + "/v1/files/" + sumOf(first) + "?u=x&e=1&s=y"}}})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	require.Equal(t, sumOf(first), r.Body["files"].([]any)[0].(map[string]any)["sha256"])
}

// TestIdenticalBytesAreStoredOncePerOwner: the same bytes in two messages
// of a user are one file, counted once against the quota; another user's
// copy is a file of their own.
func TestIdenticalBytesAreStoredOncePerOwner(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, api.Config{})
	img := pngOf(t, 16, 16, 7)
	for _, tok := range []string{b.alice, b.bob} {
		b.createConversation(t, tok, "c1")
		for _, id := range []string{"m1", "m2"} {
			r := b.do(t, tok, "POST", convPath("c1", "/messages"), map[string]any{"id": id, "content": "x",
				"files": []map[string]any{{"mediaType": "image/png", "url": dataURL("image/png", img)}}})
			require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
		}
	}
	var files, refs int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM files), (SELECT count(*) FROM message_files)`).Scan(&files, &refs))
	require.Equal(t, 2, files, "one file per owner")
	require.Equal(t, 4, refs, "one reference per message")
	used, err := schema.FileUsage(context.Background(), b.pool, b.aliceID)
	require.NoError(t, err)
	require.Equal(t, int64(len(img)), used, "identical bytes count once")
}

// TestTheQuotaHoldsAgainstConcurrentMessages: messages with files sent at
// once by one user never take more than the quota together (each new
// file counted once, whichever commits first), and the same file sent
// at once is stored once and counted once.
func TestTheQuotaHoldsAgainstConcurrentMessages(t *testing.T) {
	t.Parallel()
	imgs := make([][]byte, 8)
	for i := range imgs {
		imgs[i] = pngOf(t, 24, 24, byte(10+i))
	}
	quota := int64(len(imgs[0]))*5/2 + 10
	b := setupFiles(t, api.Config{MaxUserFileBytes: quota, MessagesPerMinute: 1000, MessageBurst: 100})
	b.createConversation(t, b.alice, "c1")
	statuses := make([]int, 2*len(imgs))
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img := imgs[i%len(imgs)]
			if i >= len(imgs) {
				img = imgs[0] // the same file, at once
			}
			r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": fmt.Sprint("m", i), "content": "x",
				"files": []map[string]any{{"mediaType": "image/png", "url": dataURL("image/png", img)}}})
			statuses[i] = r.Status
		}()
	}
	wg.Wait()
	var stored, total int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(size), 0) FROM files`).Scan(&stored, &total))
	used, err := schema.FileUsage(context.Background(), b.pool, b.aliceID)
	require.NoError(t, err)
	require.Equal(t, total, used, "the usage counts every stored file once")
	require.LessOrEqual(t, used, quota, "concurrent messages stay within the quota")
	require.Equal(t, int64(2), stored, "two distinct files fit the quota: %v", statuses)
	for _, s := range statuses {
		require.Contains(t, []int{http.StatusAccepted, http.StatusRequestEntityTooLarge}, s)
	}
}

// TestDeletingAConversationRemovesFilesNoOtherMessageReferences: a file
// goes with the last message that references it, and gives its bytes
// back to the quota; a delete that races a new message sending the same
// file never leaves that message without its file, nor fails.
func TestDeletingAConversationRemovesFilesNoOtherMessageReferences(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, api.Config{MessagesPerMinute: 1000, MessageBurst: 100})
	ctx := context.Background()
	img := pngOf(t, 12, 12, 30)
	send := func(cid, mid string) int {
		return b.do(t, b.alice, "POST", convPath(cid, "/messages"), map[string]any{"id": mid, "content": "x",
			"files": []map[string]any{{"mediaType": "image/png", "url": dataURL("image/png", img)}}}).Status
	}
	b.createConversation(t, b.alice, "a")
	b.createConversation(t, b.alice, "b")
	require.Equal(t, http.StatusAccepted, send("a", "a1"))
	require.Equal(t, http.StatusAccepted, send("b", "b1"))
	require.Equal(t, http.StatusNoContent, b.do(t, b.alice, "DELETE", convPath("a"), nil).Status)
	require.Equal(t, http.StatusOK, b.do(t, b.alice, "GET", "/v1/files/"+sumOf(img), nil).Status, "b still references the file")
	require.Equal(t, http.StatusNoContent, b.do(t, b.alice, "DELETE", convPath("b"), nil).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, b.alice, "GET", "/v1/files/"+sumOf(img), nil).Status, "no message references the file")
	used, err := schema.FileUsage(ctx, b.pool, b.aliceID)
	require.NoError(t, err)
	require.Zero(t, used, "the file's bytes are given back")

	for i := range 10 {
		old, fresh := fmt.Sprint("old", i), fmt.Sprint("new", i)
		b.createConversation(t, b.alice, old)
		b.createConversation(t, b.alice, fresh)
		require.Equal(t, http.StatusAccepted, send(old, old+"-m"))
		var wg sync.WaitGroup
		var deleted, sent int
		wg.Add(2)
		go func() { defer wg.Done(); deleted = b.do(t, b.alice, "DELETE", convPath(old), nil).Status }()
		go func() { defer wg.Done(); sent = send(fresh, fresh+"-m") }()
		wg.Wait()
		require.Equal(t, http.StatusNoContent, deleted)
		require.Equal(t, http.StatusAccepted, sent)
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `
			SELECT count(*) FROM message_files mf JOIN files f ON f.owner_id = mf.owner_id AND f.sha256 = mf.sha256 AND f.data IS NOT NULL
			JOIN messages m ON m.id = mf.message_id WHERE m.public_id = $1`, fresh+"-m").Scan(&n))
		require.Equal(t, 1, n, "round %d: the new message has its file", i)
		require.Equal(t, http.StatusNoContent, b.do(t, b.alice, "DELETE", convPath(fresh), nil).Status)
	}
	var files int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM files`).Scan(&files))
	require.Zero(t, files)
}

// TestTheSQLProducerStoresFilesThroughTheSameWritePath: baton_send_message
// takes files as data URLs (as the AI SDK's file parts carry them) or
// base64, stores them as the API does, and holds them to the same
// policies, raising their SQLSTATEs with nothing written.
func TestTheSQLProducerStoresFilesThroughTheSameWritePath(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, api.Config{})
	ctx := context.Background()
	img := pngOf(t, 6, 6, 40)
	_, err := b.pool.Exec(ctx, `SELECT baton_create_conversation('alice', 'c1', 't')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `SELECT baton_send_message('alice', 'c1', 'm1', 'see', $1::jsonb)`,
		fmt.Sprintf(`[{"url": %q, "filename": "a.png"}, {"data": %q, "media_type": "text/plain", "filename": "n.txt"}]`,
			dataURL("image/png", img), base64.StdEncoding.EncodeToString([]byte("notes\n"))))
	require.NoError(t, err)
	list := b.do(t, b.alice, "GET", convPath("c1", "/messages"), nil)
	files := list.Body["messages"].([]any)[0].(map[string]any)["files"].([]any)
	require.Len(t, files, 2)
	require.Equal(t, "image/png", files[0].(map[string]any)["media_type"])
	require.Equal(t, "text/plain", files[1].(map[string]any)["media_type"])
	resp, body := get(t, b.client, files[1].(map[string]any)["url"].(string))
	require.Equal(t, "notes\n", string(body))
	require.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))

	before := fileCounts(t, b.pool)
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT baton_send_message('alice', 'c1', 'm2', 'x', $1::jsonb)`,
			fmt.Sprintf(`[{"url": %q}]`, dataURL("image/png", []byte("%PDF-1.4\n"))))
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, schema.SQLStateMediaTypeMismatch, pgErr.Code, pgErr.Message)
	require.Equal(t, before, fileCounts(t, b.pool))
}

// TestALinkSignedWithTheDatabasesKeyWorksUntilItExpires: a link that a
// worker signs for an external agent (schema.LoadFileLinks, the key the
// database keeps) is one the API takes, until it expires; a link signed
// for another owner finds nothing.
func TestALinkSignedWithTheDatabasesKeyWorksUntilItExpires(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, api.Config{})
	b.createConversation(t, b.alice, "c1")
	img := pngOf(t, 5, 5, 50)
	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1",
		"files": []map[string]any{{"mediaType": "image/png", "url": dataURL("image/png", img)}}})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	links, err := schema.LoadFileLinks(context.Background(), b.pool)
	require.NoError(t, err)
	base := b.srv.URL + "/v1/files/" + sumOf(img) + "?"

	resp, body := get(t, b.client, base+links.Query(b.aliceID, sumOf(img), time.Now().Add(time.Minute)))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, img, body)
	resp, _ = get(t, b.client, base+links.Query(b.aliceID, sumOf(img), time.Now().Add(-time.Second)))
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "an expired link")
	resp, _ = get(t, b.client, base+links.Query(b.aliceID+1, sumOf(img), time.Now().Add(time.Minute)))
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "a link of another owner")
	other := schema.NewFileLinks([]byte("another key"))
	resp, _ = get(t, b.client, base+other.Query(b.aliceID, sumOf(img), time.Now().Add(time.Minute)))
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a link signed with another key")
}

// TestPruningRemovesFilesNoMessageReferences: a file that no message
// references (left by a store outside PostgreSQL, or by a removal that
// went around the trigger) is counted by a dry run and removed by a pass
// of prune, its bytes given back to the quota; a referenced one stays.
func TestPruningRemovesFilesNoMessageReferences(t *testing.T) {
	t.Parallel()
	b := setupFiles(t, api.Config{})
	ctx := context.Background()
	b.createConversation(t, b.alice, "c1")
	kept := pngOf(t, 4, 4, 60)
	r := b.do(t, b.alice, "POST", convPath("c1", "/messages"), map[string]any{"id": "m1",
		"files": []map[string]any{{"mediaType": "image/png", "url": dataURL("image/png", kept)}}})
	require.Equal(t, http.StatusAccepted, r.Status, r.Raw)
	_, err := b.pool.Exec(ctx, `INSERT INTO files (owner_id, sha256, media_type, size, data) VALUES ($1, $2, 'text/plain', 5, 'hello')`, b.aliceID, sumOf([]byte("hello")))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE file_usage SET bytes = bytes + 5 WHERE owner_id = $1`, b.aliceID)
	require.NoError(t, err)

	dry, err := schema.PruneDryRun(ctx, b.pool, schema.Retention{}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), dry.Files)
	res, err := schema.Prune(ctx, b.pool, schema.Retention{}, nil, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Files)
	rows, err := b.pool.Query(ctx, `SELECT sha256 FROM files`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{sumOf(kept)}, left)
	used, err := schema.FileUsage(ctx, b.pool, b.aliceID)
	require.NoError(t, err)
	require.Equal(t, int64(len(kept)), used)
}
