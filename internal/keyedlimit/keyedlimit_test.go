package keyedlimit

import (
	"testing"
	"time"
)

func TestAKeyThatFloodsWaitsWhileAnotherTakesFreely(t *testing.T) {
	l := New[string](60, 2) // one a second, two at once
	now := time.Unix(1000, 0)
	for i := range 2 {
		if d := l.Take("a", now); d != 0 {
			t.Fatalf("take %d of the burst waits %v", i, d)
		}
	}
	if d := l.Take("a", now); d <= 0 || d > time.Second {
		t.Fatalf("past the burst: wait %v, want (0, 1s]", d)
	}
	if d := l.Take("b", now); d != 0 {
		t.Fatalf("another key waits %v", d)
	}
	if d := l.Take("a", now.Add(time.Second)); d != 0 {
		t.Fatalf("a refused take takes nothing: one is back a second later, yet it waits %v", d)
	}
}

func TestABucketThatFilledUpAgainIsDropped(t *testing.T) {
	l := New[int64](60, 2) // full again 2 s after emptied
	now := time.Unix(1000, 0)
	l.Take(1, now)
	l.Take(2, now.Add(time.Second))
	l.Take(3, now.Add(2*time.Second)) // sweeps: 1 is idle 2 s, 2 only 1 s
	if _, ok := l.buckets[1]; ok {
		t.Fatal("a bucket idle for its fill time is kept")
	}
	if _, ok := l.buckets[2]; !ok {
		t.Fatal("a bucket used within its fill time is dropped")
	}
}
