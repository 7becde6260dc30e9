package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PauseWALReceiver stops the standby's WAL receiver process (SIGSTOP): the
// standby receives, flushes and confirms nothing more until
// ResumeWALReceiver, so on a primary that waits for this standby (see
// SetSynchronousStandbys) every commit waits too. It returns once the
// process is stopped. A pause longer than the primary's
// wal_sender_timeout (60s) makes the primary drop the connection; the
// receiver reconnects after the resume. Stop, of the standby or of the
// cluster it was made from, resumes the receiver first, so a paused
// standby never holds up a shutdown.
func (c *Cluster) PauseWALReceiver(ctx context.Context) error {
	c.mu.Lock()
	paused := c.pausedPID
	c.mu.Unlock()
	if paused != 0 {
		return fmt.Errorf("pgcluster: the WAL receiver of port %d (pid %d) is paused already", c.opts.Port, paused)
	}
	var pid int
	err := c.waitUntil(ctx, waitTimeout, fmt.Sprintf("pgcluster: wait for a streaming WAL receiver on port %d", c.opts.Port), func(ctx context.Context) (bool, error) {
		err := c.withConn(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, `SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'`).Scan(&pid)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return err
	}
	// The pid is recorded under the same lock as the signal, so a
	// concurrent Stop either resumes it or runs before it stops.
	c.mu.Lock()
	err = syscall.Kill(pid, syscall.SIGSTOP)
	if err == nil {
		c.pausedPID = pid
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("pgcluster: stop the WAL receiver (pid %d) of port %d: %w", pid, c.opts.Port, err)
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return nil // no /proc to watch the signal land
	}
	// The kernel stops the process when it next runs, not within kill(2).
	return c.waitUntil(ctx, 10*time.Second, fmt.Sprintf("pgcluster: wait for the WAL receiver (pid %d) of port %d to stop", pid, c.opts.Port), func(context.Context) (bool, error) {
		st, ok := processState(pid)
		if !ok {
			return false, fmt.Errorf("process %d is gone", pid)
		}
		return st == "T", nil
	})
}

// ResumeWALReceiver continues the WAL receiver that PauseWALReceiver
// stopped; commits waiting for this standby complete once it has caught
// up. Without a pause it does nothing.
func (c *Cluster) ResumeWALReceiver() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	pid := c.pausedPID
	if pid == 0 {
		return nil
	}
	c.pausedPID = 0
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgcluster: continue the WAL receiver (pid %d) of port %d: %w", pid, c.opts.Port, err)
	}
	return nil
}

// resumeAll resumes c's paused WAL receiver and those of its standbys.
func (c *Cluster) resumeAll() {
	_ = c.ResumeWALReceiver()
	c.mu.Lock()
	standbys := append([]*Cluster(nil), c.standbys...)
	c.mu.Unlock()
	for _, s := range standbys {
		_ = s.ResumeWALReceiver()
	}
}
