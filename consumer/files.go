package consumer

import (
	"context"
	"strings"
	"time"

	"github.com/batonhq/baton/schema"
)

// fileLink is Turn.FileLink: a link to a file of one of the turn's
// messages, signed for DefaultAgentFileLinkTTL, that an external agent
// fetches without a token; "" without Config.FilesURL.
func (w *Worker) fileLink(ctx context.Context, messageKey string, f schema.File) (string, error) {
	if w.cfg.FilesURL == "" {
		return "", nil
	}
	w.linksMu.Lock()
	if w.links == nil {
		l, err := schema.LoadFileLinks(ctx, w.pool)
		if err != nil {
			w.linksMu.Unlock()
			return "", err
		}
		w.links = l
	}
	links := w.links
	w.linksMu.Unlock()
	owner, err := schema.MessageFileOwner(ctx, w.pool, messageKey, f.SHA256)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(w.cfg.FilesURL, "/") + "/v1/files/" + f.SHA256 + "?" + links.Query(owner, f.SHA256, time.Now().Add(DefaultAgentFileLinkTTL)), nil
}
