# Sourced by the benchmarks: par_read FILE... reads the files with at least 8
# readers at once (dd's of file pieces, 1 MiB reads, to /dev/null) and waits
# for them: the device's limit as parallel cats see it (no memory written).
par_read() {
    local nf=$# per f sz blocks i
    per=$(( (8 + nf - 1) / nf ))
    for f in "$@"; do
        sz=$(stat -c %s "$f"); blocks=$(( (sz + 1048575) / 1048576 ))
        for ((i = 0; i < per; i++)); do
            dd if="$f" of=/dev/null bs=1M skip=$((i * blocks / per)) count=$(( (i + 1) * blocks / per - i * blocks / per )) status=none &
        done
    done
    wait
}
