package api_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/bench"
	"github.com/batonhq/baton/migrations"
	"github.com/batonhq/baton/schema"
)

// BenchmarkAttachments measures what a 1 MB image adds to a message, from
// the POST of POST /v1/conversations/{cid}/messages to its answer, which
// comes once the message, its file and its outbox row committed, on a
// durable PostgreSQL (fsync and synchronous commit on): image messages
// (a PNG of noise, about 1 MB, each a new file) and text-only messages,
// one at a time and interleaved, in the same run. The figures are the
// p50 and p99 of each.
//
//	go test -run '^$' -bench BenchmarkAttachments -benchtime 1x ./api/
func BenchmarkAttachments(b *testing.B) {
	for range b.N {
		attachmentsOnce(b)
	}
}

const (
	attachmentMessages = 100 // of each kind
	attachmentWarmup   = 5
	attachmentSide     = 592 // pixels: 592×592 of opaque noise is about 1 MB of PNG
)

func attachmentsOnce(b *testing.B) {
	ctx := context.Background()
	pg := bench.StartPostgres(b, nil)
	db := pg.Database(b)
	if _, err := migrations.Up(ctx, db.Pool); err != nil {
		b.Fatal(err)
	}
	token, _, err := schema.CreateToken(ctx, db.Pool, "alice")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := api.New(api.Config{MessagesPerMinute: 1 << 20, MessageBurst: 1 << 20}, db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	post := func(path string, body []byte) (time.Duration, int) {
		req, err := http.NewRequest("POST", hs.URL+path, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := hs.Client().Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start), resp.StatusCode
	}
	if _, status := post("/v1/conversations", []byte(`{"id":"c1"}`)); status != http.StatusCreated {
		b.Fatalf("create the conversation: %d", status)
	}

	// The bodies, made before any is timed.
	n := attachmentWarmup + attachmentMessages
	images, texts := make([][]byte, n), make([][]byte, n)
	var imageBytes int
	for i := range n {
		img := noisePNG(b, uint64(i))
		imageBytes += len(img)
		var err error
		images[i], err = json.Marshal(map[string]any{"id": fmt.Sprint("image-", i), "content": "what is in this picture?",
			"files": []map[string]any{{"mediaType": "image/png", "filename": "photo.png", "url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(img)}}})
		if err != nil {
			b.Fatal(err)
		}
		texts[i], _ = json.Marshal(map[string]any{"id": fmt.Sprint("text-", i), "content": "what is in this picture?"})
	}
	var withImage, textOnly []time.Duration
	for i := range n {
		ti, si := post("/v1/conversations/c1/messages", images[i])
		tt, st := post("/v1/conversations/c1/messages", texts[i])
		if si != http.StatusAccepted || st != http.StatusAccepted {
			b.Fatalf("message %d: %d with an image, %d text only", i, si, st)
		}
		if i >= attachmentWarmup {
			withImage, textOnly = append(withImage, ti), append(textOnly, tt)
		}
	}
	if got := db.Count(b, `SELECT count(*) FROM files`); got != int64(n) {
		b.Fatalf("%d files stored, want %d", got, n)
	}
	if got := db.Count(b, `SELECT count(*) FROM agent_outbox`); got != int64(2*n) {
		b.Fatalf("%d outbox rows, want %d", got, 2*n)
	}
	size := fmt.Sprintf("%.2f MB", float64(imageBytes)/float64(n)/1e6)
	for _, f := range []struct {
		id string
		p  float64
	}{{"36a", 50}, {"36b", 99}} {
		img, txt := bench.Percentile(withImage, f.p), bench.Percentile(textOnly, f.p)
		bench.Record(b, bench.Figure{ID: f.id,
			Name: fmt.Sprintf("POST of a message to its outbox commit, p%.0f, with a %s PNG (a new file each); %d of each, one at a time, durable commits",
				f.p, size, attachmentMessages),
			Value:     bench.Ms(img),
			Reference: bench.Ms(txt) + ", a text-only message in the same run",
			Ratio:     float64(img) / float64(txt)})
	}
}

// noisePNG is a PNG of attachmentSide² pixels of noise drawn from seed.
func noisePNG(b *testing.B, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 36))
	img := image.NewNRGBA(image.Rect(0, 0, attachmentSide, attachmentSide))
	for i := 0; i < len(img.Pix); i += 4 {
		v := rng.Uint32()
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = byte(v), byte(v>>8), byte(v>>16), 255
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.NoCompression}).Encode(&buf, img); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}
