#!/usr/bin/env bash
# Times `make demo` on a fresh Debian 12 (bookworm, amd64), built here from Debian's own
# packages: what a newcomer waits for, apt and pip included (issue 42's done-when).
#
#   scripts/fresh-demo.sh [REPO]        time `make demo` in a fresh clone of REPO (a path
#                                       or a URL; default: the checkout this script is in)
#   scripts/fresh-demo.sh --root-dir    print the bare root's cache directory (built or not)
#
# The bare root is debootstrap's minbase of bookworm plus what a user who follows the
# README installs before `make demo` (BARE_PACKAGES below), from the Debian mirror this
# machine's apt uses (MQTTBED_FRESH_DEMO_MIRROR overrides it). It is cached by the digest of
# its recipe in $MQTTBED_FRESH_DEMO_CACHE (default ~/.cache/mqttbed/fresh-demo)/<digest>/,
# so only the first use pays debootstrap. Each measurement runs in a throw-away copy of it
# (an overlayfs mount; `cp -a` where overlayfs is refused), with this machine's apt and pip
# network configuration and nothing else of this machine's, and runs exactly `make demo`
# there as root. Every recipe line make runs is timestamped (a SHELL wrapper), so each
# phase's time is read from the real run. The last line on stdout is one JSON object.
#
# Before the timed run it waits (polling every 20 s, MQTTBED_FRESH_DEMO_LOAD_WAIT_S, default
# 1200 s at most) until the 1-minute load average is below MQTTBED_FRESH_DEMO_MAX_LOAD
# (default 1.0): a busy machine measures the machine, not `make demo`. The load it started
# at is in the JSON.
#
# What it cannot measure: the copy shares this machine's kernel, CPUs and network (the
# mirrors and PyPI as reached from here); a real fresh machine may have fewer cores or a
# slower link. MQTTBED_FRESH_DEMO_KEEP=1 keeps the copy's directory for a look afterwards.
#
# Needs root (debootstrap, chroot, mounts) and debootstrap.
set -euo pipefail
# The whole script is one block, which bash reads before running any of it: an edit of
# this file during a run (minutes) cannot change what the run does next.
{

SUITE=bookworm
VARIANT=minbase
# A fresh Debian 12 has python3 but a user who follows the README installs git (to clone,
# with ca-certificates for https), make (to run `make demo`) and python3-venv (the
# Makefile's `python3 -m venv`) first: README's "Two commands" names these five.
BARE_PACKAGES="git make python3 python3-venv ca-certificates"
# A change to what the bare root is made of makes a new one; a change to how it is
# measured (the rest of this script) does not.
RECIPE_VERSION=1

here=$(cd "$(dirname "$0")" && pwd)
checkout=$(cd "$here/.." && pwd)
digest=$(printf '%s\n' "$RECIPE_VERSION" "$SUITE" "$VARIANT" "$BARE_PACKAGES" |
         sha256sum | cut -c1-16)
cache=${MQTTBED_FRESH_DEMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mqttbed/fresh-demo}
bare=$cache/$digest

if [ "${1:-}" = --root-dir ]; then echo "$bare"; exit 0; fi
repo=${1:-$checkout}

fail() { echo "fresh-demo: $*" >&2; exit 1; }
say() { echo "fresh-demo: $*" >&2; }
[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot, mounts): run it as root"
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || \
    fail "debootstrap not found: apt-get install debootstrap (as root; scripts/system-deps.sh vm brings it too)"
[ -x /usr/bin/time ] || fail "/usr/bin/time not found: apt-get install time (as root)"
[ "$(dpkg --print-architecture 2>/dev/null || echo unknown)" = amd64 ] || \
    fail "the bare root is amd64 and is run by this machine's kernel: run it on amd64"

# Seconds since boot: a monotonic clock (CLOCK_BOOTTIME), readable by bash and by the
# copy's shells through the same /proc.
now() { local up _; read -r up _ </proc/uptime; echo "$up"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# The first bookworm (not -updates, not -security) archive of this machine's apt sources,
# as apt itself reads them (deb822 or one-line, any file): the lab VM's rule
# (scripts/lab-vm/build.sh), asked of apt rather than parsed again.
mirror() {
    if [ -n "${MQTTBED_FRESH_DEMO_MIRROR:-}" ]; then echo "$MQTTBED_FRESH_DEMO_MIRROR"; return; fi
    local found
    found=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' |
            awk -v suite="$SUITE" '$2 == suite { print $1; exit }')
    [ -n "$found" ] || fail "no $SUITE archive in this machine's apt sources: set MQTTBED_FRESH_DEMO_MIRROR (e.g. http://deb.debian.org/debian)"
    echo "${found%/}"
}

# --- the bare root, built once per recipe ----------------------------------------------
bare_built_s=null
build_bare_root() {
    mkdir -p "$cache"
    # One build per digest at a time: a second caller waits, then finds it built.
    exec 9>"$cache/$digest.lock"
    flock 9
    [ -f "$bare/manifest.json" ] && return 0
    local started work source_mirror
    started=$(now)
    work=$cache/$digest.build.$$
    source_mirror=$(mirror)
    # debootstrap mounts proc and sys inside the target; never leave them, or a half root
    trap 'for m in "$work/root/proc" "$work/root/sys"; do
              mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
          rm -rf --one-file-system "$work"' EXIT
    mkdir -p "$work"
    say "bare root $digest: debootstrap $VARIANT $SUITE + ${BARE_PACKAGES// /,} from $source_mirror"
    debootstrap --variant="$VARIANT" --arch=amd64 --components=main \
        --include="${BARE_PACKAGES// /,}" "$SUITE" "$work/root" "$source_mirror" \
        >"$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log" >&2
        fail "debootstrap failed (its log's tail above)"
    }
    # A fresh install's apt has no packages waiting in its cache, and what its indexes say
    # is stale by the time a user arrives: the measured apt phase downloads both.
    rm -rf "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/lib/apt/lists/*
    local built_s used_mb
    built_s=$(elapsed "$started" "$(now)")
    used_mb=$(du -sm --one-file-system "$work/root" | cut -f1)
    cat >"$work/manifest.json" <<EOF
{"digest": "$digest", "suite": "$SUITE", "variant": "$VARIANT", "packages": "$BARE_PACKAGES", "mirror": "$source_mirror", "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "debootstrap_s": $built_s, "root_used_mb": $used_mb}
EOF
    mkdir -p "$bare"
    mv "$work/root" "$bare/root"
    mv "$work/manifest.json" "$bare/manifest.json"   # last: its presence means "built"
    rm -rf "$work"
    trap - EXIT
    bare_built_s=$built_s
    say "bare root $digest: built in $built_s s (${used_mb} MB)"
}
[ -f "$bare/manifest.json" ] || build_bare_root
exec 9>&-

# --- the throw-away copy -----------------------------------------------------------------
run_dir=$(mktemp -d "$cache/run.XXXXXX")
root=$run_dir/root
copy=overlay
mounted=()        # what this script mounted in the copy, innermost last

# Every process whose root is the copy: what `make demo` started and left behind.
copy_pids() {
    local proc
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/root" 2>/dev/null)" = "$root" ] && echo "${proc#/proc/}"
    done
    return 0
}

leftovers=0
kill_leftovers() {
    local pids tries=0
    pids=$(copy_pids)
    [ -n "$pids" ] || return 0
    leftovers=$(wc -w <<<"$pids")
    say "$leftovers process(es) left in the copy after make: $(for p in $pids; do
        tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-60; echo -n '; '; done)"
    # shellcheck disable=SC2086  # one pid a word
    kill -TERM $pids 2>/dev/null || true
    while [ -n "$(copy_pids)" ] && [ $tries -lt 50 ]; do sleep 0.1; tries=$((tries + 1)); done
    pids=$(copy_pids)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

cleanup() {
    local m i
    kill_leftovers
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        m=${mounted[$i]}
        umount -R "$m" 2>/dev/null || umount -R -l "$m" 2>/dev/null || \
            echo "fresh-demo: could not unmount $m" >&2
    done
    if [ "${MQTTBED_FRESH_DEMO_KEEP:-0}" = 1 ]; then
        say "kept the copy's files in $run_dir (rm -rf it when done)"
    else
        rm -rf --one-file-system "$run_dir"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$run_dir"/{upper,work,root}
if mount -t overlay overlay \
        -o "lowerdir=$bare/root,upperdir=$run_dir/upper,workdir=$run_dir/work" "$root" 2>/dev/null; then
    mounted+=("$root")
else
    # Some kernels and sandboxes refuse overlayfs: a full copy takes longer but is the same
    copy=cp
    rmdir "$root"
    cp -a "$bare/root" "$root"
fi

# The kernel's file systems, as a booted machine has them. rslave: what the copy mounts or
# unmounts underneath never reaches this machine's own /dev or /sys.
mount --bind /proc "$root/proc"; mounted+=("$root/proc")
mount --rbind /sys "$root/sys"; mount --make-rslave "$root/sys"; mounted+=("$root/sys")
# /dev with /dev/pts and /dev/shm (Python's multiprocessing and the JVM use /dev/shm)
mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev"; mounted+=("$root/dev")

# --- this machine's network configuration, nothing more --------------------------------
# Name resolution, and the names a Debian installer writes (localhost, the host name: Spark's
# driver binds to the host name's address).
cp /etc/resolv.conf "$root/etc/resolv.conf"
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$root/etc/hosts"
# apt reaches the archives the way this machine does: its sources replace debootstrap's
# one-line list (both would list bookworm twice), and the registry's settings if any.
rm -f "$root/etc/apt/sources.list"
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources \
         /etc/apt/apt.conf.d/99artifact-registry; do
    if [ -f "$f" ]; then cp "$f" "$root$f"; sources+=("$f"); fi
done
# apt's signing keys named by those sources (Signed-By) that Debian's keyring lacks
for key in $(grep -hoi 'Signed-By: *[^ ]*\|signed-by=[^] ]*' "${sources[@]}" 2>/dev/null |
             sed 's/.*[:=] *//' | sort -u); do
    if [ -f "$key" ] && [ ! -f "$root$key" ]; then install -D -m 644 "$key" "$root$key"; fi
done
# The copy shares this machine's network: Mosquitto's service, which apt would start on a
# real machine, would take this machine's port 1883 here and outlive the run (and fail the
# install where 1883 is taken). Debian's policy-rc.d says "start no service" (exit 101).
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
# pip reaches its index the way this machine does: /etc/pip.conf and the CA bundle it or
# PIP_CERT names. Not ~/.config/pip, /etc/xdg/pip or PIP_FIND_LINKS: they point pip at
# local wheel folders and indexes (/opt/wheels, file:// URLs) that a fresh machine does
# not have, and with them pip would download less than a newcomer's pip does.
pip_env=()
if [ -f /etc/pip.conf ]; then
    cp /etc/pip.conf "$root/etc/pip.conf"
    bundle=$(awk -F '=' '$1 ~ /^[ \t]*cert[ \t]*$/ { gsub(/[ \t]/, "", $2); print $2 }' /etc/pip.conf)
    if [ -n "$bundle" ] && [ -f "$bundle" ]; then install -D -m 644 "$bundle" "$root$bundle"; fi
fi
while IFS='=' read -r name value; do
    case $name in
        PIP_INDEX_URL|PIP_EXTRA_INDEX_URL|PIP_TRUSTED_HOST|PIP_PROXY|PIP_DEFAULT_TIMEOUT|PIP_RETRIES)
            # an index on this machine's disk is a local cache too
            [[ $value == *file:* ]] || pip_env+=("$name=$value") ;;
        PIP_CERT|PIP_CLIENT_CERT)
            if [ -f "$value" ]; then install -D -m 644 "$value" "$root$value"; fi
            pip_env+=("$name=$value") ;;
        http_proxy|https_proxy|no_proxy|HTTP_PROXY|HTTPS_PROXY|NO_PROXY)
            pip_env+=("$name=$value") ;;
    esac
done < <(env)

# --- the clone --------------------------------------------------------------------------
# What was committed, as a newcomer's clone has it: none of the checkout's uncommitted
# edits, no venv, no data, no build.
if [ -d "$repo" ]; then
    git clone --quiet --no-hardlinks "$repo" "$root/root/mqttbed"
else
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        "${pip_env[@]}" git clone --quiet "$repo" /root/mqttbed
fi
commit=$(git -C "$root/root/mqttbed" rev-parse HEAD)

# make runs each recipe line as `$(SHELL) -c LINE`: this shell logs when each starts and
# ends (seconds since boot) and make's depth, then runs it with /bin/sh as make would. A
# make run inside a recipe (the quickstart builds the agents' engine with one) inherits
# it: depth 2, inside its recipe's time. It lives beside the clone, not in it, so the
# clone stays as cloned.
mkdir -p "$root/root/.fresh-demo"
cat >"$root/root/.fresh-demo/shell" <<'EOF'
#!/bin/bash
log=/root/.fresh-demo/phases.log
line=${*: -1}
read -r up _ </proc/uptime
printf 'start\t%s\t%s\t%s\n' "$up" "${MAKELEVEL:-0}" "${line//$'\n'/ }" >>"$log"
rc=0
/bin/sh "$@" || rc=$?
read -r up _ </proc/uptime
printf 'end\t%s\t%s\t%s\t%s\n' "$up" "${MAKELEVEL:-0}" "$rc" "${line//$'\n'/ }" >>"$log"
exit $rc
EOF
chmod 755 "$root/root/.fresh-demo/shell"

# Mosquitto and Java are what make demo installs: a bare root that has them measures less
if chroot "$root" sh -c 'command -v mosquitto || [ -x /usr/sbin/mosquitto ] || command -v java' \
        >/dev/null 2>&1; then
    fail "the bare root already has mosquitto or java: it is not a fresh machine ($bare)"
fi

# --- wait for a quiet machine -----------------------------------------------------------
max_load=${MQTTBED_FRESH_DEMO_MAX_LOAD:-1.0}
wait_s=${MQTTBED_FRESH_DEMO_LOAD_WAIT_S:-1200}
waited=0
load=$(cut -d' ' -f1 /proc/loadavg)
while awk -v l="$load" -v m="$max_load" 'BEGIN { exit !(l >= m) }' && [ "$waited" -lt "$wait_s" ]; do
    [ "$waited" -eq 0 ] && say "load $load >= $max_load: waiting (up to $wait_s s) for a quieter machine"
    sleep 20
    waited=$((waited + 20))
    load=$(cut -d' ' -f1 /proc/loadavg)
done
quiet=true
awk -v l="$load" -v m="$max_load" 'BEGIN { exit !(l >= m) }' && quiet=false && \
    say "load still $load after $waited s: running anyway"

# --- make demo, timed --------------------------------------------------------------------
say "make demo in a fresh $SUITE ($copy copy of $digest), clone of $repo at ${commit:0:12}, load $load"
started=$(now)
rc=0
# PIP_VERBOSE=1 against the Makefile's --quiet is pip's default verbosity: one
# "Downloading NAME (SIZE)" line a download, which is how pip's downloads are measured (its
# HTTP cache is no measure: responses marked uncacheable, as some proxies send them, are
# never stored). It changes what pip prints, not what it does.
/usr/bin/time -f '%e %U %S %M' -o "$run_dir/time.txt" \
    chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb PIP_VERBOSE=1 "${pip_env[@]}" \
    /bin/sh -c 'cd /root/mqttbed && exec make demo SHELL=/root/.fresh-demo/shell' \
    >"$run_dir/make.log" 2>&1 || rc=$?
ended=$(now)
kill_leftovers
tail -n 25 "$run_dir/make.log" >&2
# What the run measured is read below; a figure that cannot be read is reported as such,
# never a reason to lose the others. The logs are kept beside the cache whatever happens.
set +e
trap 'echo "fresh-demo: line $LINENO failed (a figure may be missing)" >&2' ERR
results=$cache/results/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$results"
cp "$run_dir/make.log" "$run_dir/time.txt" "$root/root/.fresh-demo/phases.log" "$results/"
[ "$rc" -eq 0 ] || say "make demo failed (exit $rc): the log's tail is above"

# --- what was measured -------------------------------------------------------------------
# Each recipe line's time, summed by the phase it belongs to. make demo's own recipes
# (depth 1) run one after another: the install (a nested make, two jobs at a time), the
# quickstart, the report. The nested make's recipes (depth 2) overlap: apt beside pip's
# first step, Spark's class archive beside pip's second, so apt_s + pip_s + archive_s can
# exceed install_s.
phases=$(awk -F '\t' '
    function phase(cmd) {
        if (cmd ~ /demo-install/) return "install"
        if (cmd ~ /system-deps\.sh/) return "apt"
        if (cmd ~ /class_archive/) return "archive"
        if (cmd ~ /-m venv|pip install|installed-(demo|spark)/) return "pip"
        if (cmd ~ /mqttbed run /) return "quickstart"
        if (cmd ~ /mqttbed report /) return "report"
        return "other"
    }
    $1 == "start" { t0[$3, $4] = $2 }
    # deeper recipes of another phase are part of a step of make demo (the quickstart
    # builds the engine of the agents with make): counted there
    $1 == "end" && ($3 == 1 || ($3 == 2 && phase($5) ~ /^(apt|pip|archive)$/)) {
        s[phase($5)] += $2 - t0[$3, $5]
        if ($4 != 0 && failed == "") failed = phase($5)
    }
    END {
        printf "\"install_s\": %.1f, \"apt_s\": %.1f, \"pip_s\": %.1f, \"archive_s\": %.1f, ",
            s["install"], s["apt"], s["pip"], s["archive"]
        printf "\"quickstart_s\": %.1f, \"report_s\": %.1f, ", s["quickstart"], s["report"]
        printf "\"other_s\": %.1f, \"failed_phase\": %s", s["other"],
            failed == "" ? "null" : "\"" failed "\""
    }' "$root/root/.fresh-demo/phases.log" 2>/dev/null || echo '"failed_phase": "no phase ran"')
# (time writes "Command exited with non-zero status N" above its figures when make fails)
read -r _wall cpu_user cpu_sys max_rss_kb < <(tail -n 1 "$run_dir/time.txt") || true
# MB as apt and pip print them: 10^6 bytes
mb() { awk -v b="${1:-0}" 'BEGIN { printf "%.1f", b / 1e6 }'; }
debs_bytes=$(find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -printf '%s\n' |
             awk '{ s += $1 } END { print s + 0 }')
# the indexes apt-get update fetched, as stored (uncompressed: more than it downloaded)
lists_bytes=$(du -sb "$root/var/lib/apt/lists" | cut -f1)
# pip's "Downloading NAME (SIZE)" lines: pip-23.0.1-py3-none-any.whl (2.1 MB), (35 kB), (512 bytes)
pip_downloads=$(awk '$1 == "Downloading" && $NF ~ /^(bytes|kB|MB|GB)\)$/ {
        size = substr($(NF - 1), 2); unit = $NF
        scale = unit ~ /^GB/ ? 1e9 : unit ~ /^MB/ ? 1e6 : unit ~ /^kB/ ? 1e3 : 1
        printf "%d %s\n", size * scale, $2
    }' "$run_dir/make.log" | sort -rn)
pip_bytes=$(awk '{ s += $1 } END { print s + 0 }' <<<"$pip_downloads")
pip_count=$(grep -c . <<<"$pip_downloads" || true)
debs_count=$(find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' | wc -l)

# Where the time went: the biggest packages apt and pip downloaded.
{
    echo "biggest .deb downloads ($debs_count packages, $(mb "$debs_bytes") MB):"
    find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -printf '%s %f\n' |
        sort -rn | head -n 8 | awk '{ printf "  %7.1f MB  %s\n", $1 / 1e6, $2 }'
    echo "biggest pip downloads ($pip_count files, $(mb "$pip_bytes") MB):"
    head -n 8 <<<"$pip_downloads" | awk '{ printf "  %7.1f MB  %s\n", $1 / 1e6, $2 }'
} 2>&1 | tee "$results/downloads.txt" >&2

ok=false; [ "$rc" -eq 0 ] && ok=true
echo "{\"ok\": $ok, $phases, \"total_s\": $(elapsed "$started" "$ended"), \"downloaded_debs_mb\": $(mb "$debs_bytes"), \"apt_lists_disk_mb\": $(mb "$lists_bytes"), \"pip_downloaded_mb\": $(mb "$pip_bytes"), \"cpu_user_s\": ${cpu_user:-null}, \"cpu_sys_s\": ${cpu_sys:-null}, \"max_rss_mb\": $(mb "$(( ${max_rss_kb:-0} * 1024 ))"), \"load_at_start\": $load, \"quiet_at_start\": $quiet, \"load_waited_s\": $waited, \"leftover_processes\": $leftovers, \"bare_root\": \"$digest\", \"bare_root_built_s\": $bare_built_s, \"copy\": \"$copy\", \"commit\": \"$commit\"}" | tee "$results/fresh-demo.json"
exit "$rc"
}
