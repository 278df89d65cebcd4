#!/usr/bin/env python3
"""Checkpoints saved again under the same folder name while dcpfs mounts their run folder.

usage: fuse_resave.py save DIR... VERSION
       fuse_resave.py all SOURCE MOUNTPOINT LOG N   (steps, then churn N, then cwd)
       fuse_resave.py single CHECKPOINT MOUNTPOINT LOG
       fuse_resave.py shutdown CHECKPOINT MOUNTPOINT LOG CATALOG PID term|lazy|umount

One process a mount: importing torch is most of a call's cost.
SOURCE is the folder dcpfs mounts at MOUNTPOINT (folder mode), holding SOURCE/latest saved
with version 1 by `fuse_resave.py save DIR 1` before the mount. Each step saves a new
version with torch.distributed.checkpoint.save (one process, no process group), waits out
the scan folder's one-second timeouts and reads the mount: every value must be the new
version's, whole ('w' is VERSION repeated, its length the version's; the key 'vN' is the
version's own). Versions alternate between two lengths of 'w', so old offsets into new
shard files would read other bytes. Steps: a save into the same folder (what torch does on
a second save: shard files rewritten in place, .metadata renamed over), rm -rf then a save,
a save elsewhere renamed into place; a file held open across a save in place reads the old
bytes or fails (EIO), never the new ones; a save while the folder is listed over and
over; a checkpoint that appears (shards first, .metadata last) and one removed.
"""
import errno, os, shutil, subprocess, sys, time, warnings

import torch
import torch.distributed.checkpoint as dcp

SCAN_TIMEOUT = 1.3   # dcpfs keeps a scan folder's entries one second


def length(v):
    return 1 << 20 if v % 2 else 3 << 18   # 4 MiB or 3 MiB of float32


def state(v):
    return {"w": torch.full((length(v),), float(v), dtype=torch.float32),
            "b": torch.arange(16, dtype=torch.int64) + v,
            "v%d" % v: torch.tensor([v], dtype=torch.int32)}


def save(path, v):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "no process group", "overwriting"
        dcp.save(state(v), checkpoint_id=path)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def values(data):
    return sorted(set(torch.frombuffer(bytearray(data), dtype=torch.float32).tolist())) if data else []


def expect(ckpt, v, what):
    """The mount's checkpoint folder ckpt holds version v, whole."""
    try:
        with open(os.path.join(ckpt, "w"), "rb") as f:
            data = f.read()
        names = set(os.listdir(ckpt))
        with open(os.path.join(ckpt, "b"), "rb") as f:
            b = torch.frombuffer(bytearray(f.read()), dtype=torch.int64).tolist()
    except OSError as e:
        fail("%s: reading %s: %s" % (what, ckpt, e))
    if len(data) != 4 * length(v) or values(data) != [float(v)]:
        fail("%s: %s/w has %d bytes of values %s, version %d has %d bytes of %.1f"
             % (what, ckpt, len(data), values(data)[:6], v, 4 * length(v), v))
    if b != [i + v for i in range(16)]:
        fail("%s: %s/b reads %s, version %d's is %s" % (what, ckpt, b[:4], v, [v, v + 1, v + 2, v + 3]))
    stale = sorted(n for n in names if n.startswith("v") and n != "v%d" % v)
    if "v%d" % v not in names or stale:
        fail("%s: %s lists %s (version %d's key is v%d)" % (what, ckpt, sorted(names), v, v))


def models(log, name):
    """Checkpoints named name (the last component of their path) the daemon has open, by its
    log (the daemon runs with -d): each opened one says 'model parsed' or 'served from the
    catalog', each freed one 'is closed'."""
    with open(log, errors="replace") as f:
        lines = [ln for ln in f if "/%s: " % name in ln]
    return (sum("model parsed" in ln or "model served from the catalog" in ln for ln in lines)
            - sum("saved there before is closed" in ln for ln in lines))


def settle(log, name, most):
    """Wait until at most `most` models of name are open (dcpfs tells the kernel to drop its
    entries of a checkpoint saved again, and of a file of one once it is closed: their FORGETs
    free the model); how many are. The wait is bounded, never timed: 20 s for what takes
    milliseconds."""
    end = time.monotonic() + 20
    while models(log, name) > most and time.monotonic() < end:
        time.sleep(0.1)
    return models(log, name)


def churn(src, mnt, log, n):
    """Saved again n times into the same folder under one mount: each read gives the last
    save, and the daemon frees the models of the saves before (at most two stay open: the
    last, and the one before while the kernel forgets it); a file held open across three
    saves reads its own save's bytes, and its model is freed once it is closed and the
    kernel forgot it."""
    latest, mlatest = os.path.join(src, "latest"), os.path.join(mnt, "latest")
    base = None
    for i in range(n):
        v = 100 + i
        save(latest, v)
        time.sleep(SCAN_TIMEOUT)
        expect(mlatest, v, "saved again %d times" % (i + 1))
        if i == 2:
            base = os.statvfs(mnt).f_files
    left = settle(log, "latest", 1)   # the names of the saves before were invalidated
    if left > 1:
        fail("after %d saves into the same folder the daemon has %d models of it open" % (n, left))
    nodes = os.statvfs(mnt).f_files
    if nodes > base + 12:   # a model (5 nodes) per save kept: 5 * (n - 3) more
        fail("after %d saves the mount has %d nodes, %d after the third" % (n, nodes, base))

    # Held open across 3 saves, each made elsewhere and renamed into place (the old folders
    # kept, so the old bytes are there to read)
    v = 100 + n - 1   # the last save's
    fd = os.open(os.path.join(mlatest, "w"), os.O_RDONLY)
    try:
        old = []
        for k in range(3):
            new, aside = os.path.join(src, ".latest.new"), os.path.join(src, ".latest.old%d" % k)
            save(new, v + 1 + k)
            os.rename(latest, aside)
            os.rename(new, latest)
            old.append(aside)
            time.sleep(SCAN_TIMEOUT)
            expect(mlatest, v + 1 + k, "saved elsewhere and renamed into place, a file held open")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)   # the reads reach dcpfs
        data = os.pread(fd, 4 * length(v), 0)
        if len(data) != 4 * length(v) or values(data) != [float(v)]:
            fail("a file held open across 3 saves reads %d bytes of values %s, its own save's are %d of %.1f"
                 % (len(data), values(data)[:6], 4 * length(v), v))
        if settle(log, "latest", 2) != 2:
            fail("%d models of latest are open while a file of an old save is (2 expected)" % models(log, "latest"))
    finally:
        os.close(fd)
    # No drop_caches: the kernel lets go of the closed file's entries when dcpfs tells it to
    if settle(log, "latest", 1) != 1:
        fail("%d models of latest are open after the file held open was closed (1 expected)" % models(log, "latest"))
    expect(mlatest, v + 3, "the file held open closed")
    for aside in old:
        shutil.rmtree(aside)


def single(src, mnt, log):
    """SOURCE is one checkpoint (version 1 when mounted): saved again in place, then removed
    and saved again, the mount shows the new save; a file held open across a save in place
    fails (EIO); the old models are freed."""
    name = os.path.basename(src)
    expect(mnt, 1, "one checkpoint")
    fd = os.open(os.path.join(mnt, "w"), os.O_RDONLY)
    try:
        save(src, 2)
        time.sleep(SCAN_TIMEOUT)
        expect(mnt, 2, "one checkpoint saved again in place")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            late = os.pread(fd, 4096, 2 << 20)
            fail("w held open across a save in place reads values %s" % values(late))
        except OSError as e:
            if e.errno != errno.EIO:
                fail("w held open across a save in place fails with %s, not EIO" % e)
    finally:
        os.close(fd)
    shutil.rmtree(src)
    save(src, 3)
    time.sleep(SCAN_TIMEOUT)
    expect(mnt, 3, "one checkpoint removed and saved again")
    for v in range(4, 9):
        save(src, v)
        time.sleep(SCAN_TIMEOUT)
        expect(mnt, v, "one checkpoint saved again (%d)" % v)
    if settle(log, name, 1) != 1:
        fail("%d models of the one checkpoint are open after 8 saves (1 expected)" % models(log, name))


def held_cwd(src, mnt, log):
    """A process working in a folder of a checkpoint (its key tree: layer/0/w) while the
    checkpoint is saved again in place: the folder answers lookups (its files fail with EIO,
    their shard files rewritten), the new save reads whole through the mount, and the old
    save's model is freed once the process leaves (dcpfs tells the kernel to drop the old
    save's folders' names, and each name looked up there after the save)."""
    nested, mnested = os.path.join(src, "nested"), os.path.join(mnt, "nested")

    def layer(v):
        return {"layer.0.w": torch.full((length(v),), float(v), dtype=torch.float32),
                "layer.0.v%d" % v: torch.tensor([v], dtype=torch.int32)}

    def check(folder, v, what):
        try:
            with open(os.path.join(folder, "w"), "rb") as f:
                data = f.read()
            names = sorted(os.listdir(folder))
        except OSError as e:
            fail("%s: reading %s: %s" % (what, folder, e))
        if len(data) != 4 * length(v) or values(data) != [float(v)] or names != ["v%d" % v, "w"]:
            fail("%s: %s lists %s, its w has %d bytes of values %s; version %d's has %d of %.1f"
                 % (what, folder, names, len(data), values(data)[:6], v, 4 * length(v), v))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(layer(1), checkpoint_id=nested)
    time.sleep(SCAN_TIMEOUT)
    held = subprocess.Popen(["sleep", "120"], cwd=os.path.join(mnested, "layer", "0"))
    try:
        cwd = "/proc/%d/cwd" % held.pid
        check(cwd, 1, "a working directory in a checkpoint")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(layer(2), checkpoint_id=nested)
        time.sleep(SCAN_TIMEOUT)
        check(os.path.join(mnested, "layer", "0"), 2, "saved again in place, a process working in the old save")
        try:
            os.stat(os.path.join(cwd, "v1"))
        except OSError as e:
            fail("a working directory in an old save: looking up v1 there fails: %s" % e)
        if os.path.exists(os.path.join(cwd, "v2")):
            fail("a working directory in an old save has the new save's v2")
        # Its files name shard files saved over: an error, never the new save's bytes
        try:
            fd = os.open(os.path.join(cwd, "w"), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                late = os.pread(fd, 4096, 0)
            finally:
                os.close(fd)
            fail("w in a working directory in an old save reads values %s" % values(late))
        except OSError as e:
            if e.errno != errno.EIO:
                fail("w in a working directory in an old save fails with %s, not EIO" % e)
        if settle(log, "nested", 2) != 2:
            fail("%d models of nested are open while a process works in the old save (2 expected)"
                 % models(log, "nested"))
    finally:
        held.kill()
        held.wait()
    # No drop_caches: the kernel drops the old save's folders once the process has left
    if settle(log, "nested", 1) != 1:
        fail("%d models of nested are open after the process working in the old save left (1 expected)"
             % models(log, "nested"))
    check(os.path.join(mnested, "layer", "0"), 2, "the process working in the old save gone")
    shutil.rmtree(nested)


def ended(pid):
    """Has process pid exited (gone, or a zombie its parent has not waited for yet)?"""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def shutdown(src, mnt, log, catalog, pid, how):
    """SOURCE one checkpoint (version 1 when mounted, with -o catalog), the session ended
    (how: term, SIGTERM; lazy, fusermount3 -uz; umount, fusermount3 -u) while dcpfs tells the
    kernel to drop the old save's names: the daemon must exit, never hang.

    term and lazy: a lookup in the mount's root finds the new save (the old one's names are
    queued to be invalidated) and opens it, which waits for the catalog this process holds;
    the invalidation waits for that lookup (the kernel holds the root's lock while dcpfs
    answers), and more lookups queue behind the invalidation. Then the session is ended, and
    the catalog let go: the lookups that come after the request loop stopped must still be
    answered for the invalidation to be written and the daemon to exit. umount: nothing in
    use, the names just queued when the mount goes."""
    import signal, sqlite3, subprocess
    expect(mnt, 1, "before the session ends")
    save(src, 2)
    hammers, db = [], None
    if how != "umount":
        db = sqlite3.connect(catalog, timeout=60, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        mark = os.path.getsize(log)
        first = subprocess.Popen(["stat", os.path.join(mnt, "looked_up")], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            with open(log, errors="replace") as f:
                f.seek(mark)
                if ".metadata changed: the checkpoint is read anew" in f.read():
                    break
            time.sleep(0.05)
        else:
            fail("(%s) dcpfs did not see the new save" % how)
        time.sleep(0.3)   # the invalidation is under way, waiting for that lookup
        hammers = [subprocess.Popen(["sh", "-c", 'i=0; while :; do i=$((i+1)); stat "$0/x$i.%d" '
                                     '>/dev/null 2>&1; done' % k, mnt]) for k in range(2)]
        time.sleep(0.3)
    else:
        os.listdir(mnt)   # a request on the root: the old save retired, its names queued
    if how == "term":
        os.kill(pid, signal.SIGTERM)
    else:
        subprocess.run(["fusermount3", "-uz" if how == "lazy" else "-u", mnt], check=True)
    time.sleep(0.5)
    if db:
        db.rollback()   # the new save's open goes on
        db.close()
    end = time.monotonic() + 60
    while not ended(pid) and time.monotonic() < end:
        time.sleep(0.1)
    for h in hammers:
        h.kill()
    if not ended(pid):
        fail("(%s) dcpfs is still running 60 s after the session was ended" % how)


def steps(src, mnt):
    """The steps of the module's docstring, under a folder-mode mount."""
    latest, mlatest = os.path.join(src, "latest"), os.path.join(mnt, "latest")
    expect(mlatest, 1, "before any save")

    # torch's own second save into the same folder
    save(latest, 2)
    time.sleep(SCAN_TIMEOUT)
    expect(mlatest, 2, "saved again into the same folder")

    # rm -rf, then a save under the same name
    shutil.rmtree(latest)
    save(latest, 3)
    time.sleep(SCAN_TIMEOUT)
    expect(mlatest, 3, "removed and saved again")

    # saved elsewhere, then renamed into place (the old one moved aside, then removed)
    new, old = os.path.join(src, ".latest.new"), os.path.join(src, ".latest.old")
    save(new, 4)
    os.rename(latest, old)
    os.rename(new, latest)
    time.sleep(SCAN_TIMEOUT)
    expect(mlatest, 4, "saved elsewhere and renamed into place")
    shutil.rmtree(old)
    time.sleep(SCAN_TIMEOUT)
    expect(mlatest, 4, "its old folder removed")

    # Files held open across a save in place of the same length: an error (EIO), never the
    # new bytes at the old offsets (nor a mix). Their pages are dropped from the kernel's
    # cache first, so the reads reach dcpfs; the old bytes are gone from the shard.
    save(latest, 6)
    time.sleep(SCAN_TIMEOUT)
    expect(mlatest, 6, "saved again (version 6)")
    held = {}
    try:
        for name in ("w", "all.safetensors"):
            fd = held[name] = os.open(os.path.join(mlatest, name), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if values(os.pread(held["w"], 4096, 0)) != [6.0]:
            fail("a file held open reads other values than version 6's before the save")
        st_size = os.fstat(held["all.safetensors"]).st_size
        save(latest, 8)   # the same length as 6
        for name, fd in held.items():
            at = (2 << 20) if name == "w" else st_size - (1 << 20)   # inside w either way
            try:
                late = os.pread(fd, 4096, at)
            except OSError as e:
                if e.errno != errno.EIO:
                    fail("%s held open across a save fails with %s, not EIO" % (name, e))
                continue
            fail("%s held open across a save in place reads %d bytes of values %s at %d: the new "
                 "save's bytes through the old checkpoint" % (name, len(late), values(late), at))
    finally:
        for fd in held.values():
            os.close(fd)
    time.sleep(SCAN_TIMEOUT)
    expect(mlatest, 8, "after the file held open was closed")

    # Saved again while the run folder is listed over and over (a listing gives each name's
    # inode: were the old one's given, the name would never be looked up again)
    save(latest, 10)
    end = time.monotonic() + 3 * SCAN_TIMEOUT
    while time.monotonic() < end:
        os.listdir(mnt)
        os.stat(mlatest)
        time.sleep(0.1)
    expect(mlatest, 10, "saved again while its folder is listed")

    # A checkpoint that appears while mounted (the folder, the shards, .metadata last),
    # then one removed
    step = os.path.join(src, "step_9")
    save(step, 9)
    time.sleep(SCAN_TIMEOUT)
    expect(os.path.join(mnt, "step_9"), 9, "a checkpoint saved while mounted")
    if sorted(os.listdir(mnt)) != ["latest", "step_9"]:
        fail("the mount lists %s" % sorted(os.listdir(mnt)))
    shutil.rmtree(step)
    time.sleep(SCAN_TIMEOUT)
    if os.path.exists(os.path.join(mnt, "step_9")) or sorted(os.listdir(mnt)) != ["latest"]:
        fail("a removed checkpoint is still shown: the mount lists %s" % sorted(os.listdir(mnt)))
    expect(mlatest, 10, "another checkpoint removed")


def main():
    if sys.argv[1] == "save":
        for path in sys.argv[2:-1]:
            save(path, int(sys.argv[-1]))
    elif sys.argv[1] == "all":
        src, mnt, log = sys.argv[2:5]
        steps(src, mnt)
        churn(src, mnt, log, int(sys.argv[5]))
        held_cwd(src, mnt, log)
    elif sys.argv[1] == "shutdown":
        shutdown(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7])
    elif sys.argv[1] == "single":
        single(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        fail("unknown command %r" % sys.argv[1])


if __name__ == "__main__":
    main()
