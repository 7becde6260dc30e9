package schema_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/schema"
)

// TestTheStoreFindsMediaTypesAsDetectContentTypeDoes: the media type the
// producer function finds in a file's bytes (baton_sniff_media_type) is
// the one Go's net/http.DetectContentType finds, for every type the store
// knows, and application/octet-stream for bytes of any other; with one
// difference on purpose: text must be UTF-8 (DetectContentType takes any
// bytes without binary control bytes for text, whatever their charset),
// since Baton serves and sends text files as UTF-8.
func TestTheStoreFindsMediaTypesAsDetectContentTypeDoes(t *testing.T) {
	t.Parallel()
	db := testenv.Database(t)
	img := image.NewGray(image.Rect(0, 0, 2, 2))
	var p, j, g bytes.Buffer
	require.NoError(t, png.Encode(&p, img))
	require.NoError(t, jpeg.Encode(&j, img, nil))
	require.NoError(t, gif.Encode(&g, img, nil))
	webp := append([]byte("RIFF\x1a\x00\x00\x00WEBPVP8 "), make([]byte, 14)...)
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"png", p.Bytes()}, {"jpeg", j.Bytes()}, {"gif", g.Bytes()}, {"webp", webp},
		{"pdf", []byte("%PDF-1.7\n1 0 obj\n")}, {"text", []byte("plain words\nand lines\n")}, {"utf-8 text", []byte("grüße, 世界\n")},
		{"a zip", []byte("PK\x03\x04\x14\x00\x00\x00")}, {"an ELF binary", []byte("\x7fELF\x02\x01\x01\x00")}, {"NUL in text", []byte("a\x00b")},
		{"a control byte", []byte("bell\x07")},
	} {
		var got string
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT baton_sniff_media_type($1)`, tc.data).Scan(&got))
		want, _, _ := strings.Cut(http.DetectContentType(tc.data), ";")
		if !strings.HasPrefix(want, "image/") && want != "application/pdf" && want != "text/plain" {
			want = "application/octet-stream"
		}
		require.Equal(t, want, got, tc.name)
	}
	var latin1 string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT baton_sniff_media_type($1)`, []byte("caf\xe9 au lait")).Scan(&latin1))
	require.Equal(t, "application/octet-stream", latin1, "text that is not UTF-8 is not taken for text")
}

// TestTheSQLProducersFileDefaultsAreSchemas: a message of the SQL producer
// is held to schema.FileLimits' defaults, which the function writes out
// again: the files a message may have, the bytes a file may have and the
// media types taken.
func TestTheSQLProducersFileDefaultsAreSchemas(t *testing.T) {
	t.Parallel()
	b := setupTurns(t)
	ctx := context.Background()
	var name string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT name FROM users WHERE id = $1`, b.owner).Scan(&name))
	b.conversation(t, "c1")
	send := func(files string) string {
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT baton_send_message($1, 'c1', 'm1', 'x', $2::jsonb)`, name, files)
			return err
		})
		require.Error(t, err)
		return err.Error()
	}
	file := func(data []byte) string {
		return fmt.Sprintf(`{"media_type": "text/plain", "data": "%s"}`, b64(data))
	}
	many := strings.TrimSuffix(strings.Repeat(file([]byte("a"))+",", schema.DefaultMaxFiles+1), ",")
	require.Contains(t, send("["+many+"]"), fmt.Sprintf("the limit is %d a message", schema.DefaultMaxFiles))
	require.Contains(t, send("["+file(bytes.Repeat([]byte("a"), schema.DefaultMaxFileBytes+1))+"]"), fmt.Sprintf("the limit is %d bytes a file", schema.DefaultMaxFileBytes))
	require.Contains(t, send("["+file([]byte("\x7fELF\x02\x01"))+"]"), "send one of "+strings.Join(schema.DefaultFileMediaTypes, ", "))
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
