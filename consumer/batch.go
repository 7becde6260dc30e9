package consumer

// batcher runs calls of one kind (claims, finalizes) together, one
// statement at a time, as a database's group commit does: a call that
// finds no statement in flight runs at once, alone, so a lone message waits
// for nothing; calls that arrive while a statement runs all go into the
// next one, up to max. Under load many turns share one round trip and one
// transaction, and the size of a batch follows the load by itself.
type batcher[Req, Res any] struct {
	calls chan batchCall[Req, Res]
	max   int
	run   func([]Req) []Res
	stop  chan struct{}
	done  chan struct{}
}

type batchCall[Req, Res any] struct {
	req    Req
	result chan Res
}

// startBatcher starts a batcher of run, whose batches hold at most max
// calls; close stops it.
func startBatcher[Req, Res any](max int, run func([]Req) []Res) *batcher[Req, Res] {
	b := &batcher[Req, Res]{calls: make(chan batchCall[Req, Res], max), max: max, run: run, stop: make(chan struct{}), done: make(chan struct{})}
	go b.serve()
	return b
}

// do runs req in the next batch and returns its result. It must not be
// called after close.
func (b *batcher[Req, Res]) do(req Req) Res {
	c := batchCall[Req, Res]{req: req, result: make(chan Res, 1)}
	b.calls <- c
	return <-c.result
}

// close stops the batcher once the batch it runs is done.
func (b *batcher[Req, Res]) close() {
	close(b.stop)
	<-b.done
}

func (b *batcher[Req, Res]) serve() {
	defer close(b.done)
	for {
		var batch []batchCall[Req, Res]
		select {
		case c := <-b.calls:
			batch = append(batch, c)
		case <-b.stop:
			return
		}
	more:
		for len(batch) < b.max {
			select {
			case c := <-b.calls:
				batch = append(batch, c)
			default:
				break more
			}
		}
		reqs := make([]Req, len(batch))
		for i, c := range batch {
			reqs[i] = c.req
		}
		res := b.run(reqs)
		for i, c := range batch {
			c.result <- res[i]
		}
	}
}
