# collective loader tests
