package cli

import "errors"

type devCmd struct{}

func (devCmd) Run() error { return errors.New("baton dev is not built yet") }
