package lockservice

import "errors"

func errorIs(err, target error) bool { return errors.Is(err, target) }
