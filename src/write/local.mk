# writers, converters and synth (issue 4)
