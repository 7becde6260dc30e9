package cli

import "errors"

type workerCmd struct{}

func (workerCmd) Run() error { return errors.New("baton worker is not built yet") }
