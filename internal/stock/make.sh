#!/bin/bash
# Makes the stock templates' Debian root, run as host root by package
# stock (stock.go), which mounts, keys and stores what this makes. Every
# package comes from the Debian archive the host's apt uses, checked
# against Debian's keyring as the host's own are; maintainer scripts run
# in a chroot, as debootstrap's do.
#
#   make.sh base ROOT SUITE MIRROR SOURCES PACKAGE...
#       debootstrap ROOT, give it the apt sources SOURCES (a deb822 file),
#       install PACKAGE... and the sandbox's user.
#   make.sh interpreter ROOT BASE UPPER WORK PACKAGE... -- NPM_PACKAGE...
#       mount at ROOT an overlay of UPPER (its work directory WORK) over
#       the base root BASE, and install there the code interpreter's
#       Debian packages, npm packages and kernels: UPPER gathers them.
#
# stock.go runs this in a private mount namespace of its own: the mounts
# made here go when it ends.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
stage=$1 root=$2
shift 2

# enter prepares ROOT for commands run in it: no service starts, /proc
# for maintainer scripts, the host's resolver for the downloads.
enter() {
	printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
	chmod 755 "$root/usr/sbin/policy-rc.d"
	mount -t proc proc "$root/proc"
	trap 'umount -l "$root/proc" 2>/dev/null || true' EXIT
	rm -f "$root/etc/resolv.conf"
	cp -L /etc/resolv.conf "$root/etc/resolv.conf"
}

# leave removes what the root's sandboxes must not keep: package lists
# and archives (stale, and large), logs, caches, the host's resolver.
leave() {
	chroot "$root" apt-get clean
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log \
		"$root"/var/log/apt/* "$root"/tmp/* "$root"/var/tmp/* "$root"/root/.npm "$root"/root/.cache \
		"$root/usr/sbin/policy-rc.d"
	: > "$root/etc/resolv.conf"
	umount -l "$root/proc"
	trap - EXIT
}

apt_install() {
	chroot "$root" apt-get update -qq
	chroot "$root" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# patch_tslab makes tslab (the version NPM_PACKAGE pins) answer as
# Jupyter's kernels, and E2B's JavaScript kernel, do: a cell's last value
# is its result (execute_result, util.inspect's text), not a line it
# prints; an exception is the cell's error (its name, message and stack),
# not only text on stderr; and a cell sent after one that failed runs, rather than being
# aborted for 200 ms (those queued behind it still are, as Jupyter's are).
# Each edit must apply exactly once.
patch_tslab() {
	local dist=$1
	edit "$dist/executor.js" 'console.log(ret);' \
		'const show = require("./jupyter").lastWriteDisplayData; if (show) show({ data: { "text/plain": require("util").inspect(ret) }, metadata: {} }, false, true); else console.log(ret);'
	edit "$dist/jupyter.js" 'const writeDisplayData = (data, update) => {' 'const writeDisplayData = (data, update, result) => {'
	edit "$dist/executor.js" 'console.error(e);' \
		'const pub = require("./jupyter").lastWriteDisplayData; if (pub && e instanceof Error) pub({ ename: e.name, evalue: e.message, traceback: String(e.stack).split("\n") }, false, "error"); else console.error(e);' 2
	edit "$dist/jupyter.js" 'reply.header.msg_type = update ? "update_display_data" : "display_data";' \
		'reply.header.msg_type = result === "error" ? "error" : result ? "execute_result" : update ? "update_display_data" : "display_data";'
	edit "$dist/jupyter.js" 'reply.content = data;' 'reply.content = result === true ? Object.assign({ execution_count: null }, data) : data;'
	edit "$dist/jupyter.js" 'this.execQueue.reset(200);' 'this.execQueue.reset();'
}

# edit replaces the COUNT (default 1) occurrences of OLD in FILE with
# NEW, or fails.
edit() {
	local file=$1 old=$2 new=$3 count=${4:-1}
	OLD=$old NEW=$new COUNT=$count perl -0pi -e '$n = s/\Q$ENV{OLD}\E/$ENV{NEW}/g; END { exit($n == $ENV{COUNT} ? 0 : 1) }' "$file" ||
		{ echo "make.sh: $file: the edit of \"$old\" does not apply $count time(s)" >&2; exit 1; }
}

case $stage in
base)
	suite=$1 mirror=$2 sources=$3
	shift 3
	debootstrap --variant=minbase --components=main "$suite" "$root" "$mirror" >/dev/null
	rm -f "$root/etc/apt/sources.list"
	install -m 0644 "$sources" "$root/etc/apt/sources.list.d/debian.sources"
	enter
	chroot "$root" apt-get update -qq
	chroot "$root" apt-get upgrade -y -qq >/dev/null
	apt_install "$@"
	# The sandbox's user, as E2B's templates have it: uid 1000, bash.
	chroot "$root" groupadd -g 1000 user
	chroot "$root" useradd -m -u 1000 -g 1000 -s /bin/bash user
	# pip installs as on E2B, whose Python has no PEP 668 marker: root's
	# packages in /usr/local, the user's in ~/.local (made now: Python
	# puts it on sys.path only if it exists when it starts, and a
	# pool's kernel starts before the first pip install).
	printf '[global]\nbreak-system-packages = true\n' > "$root/etc/pip.conf"
	py=$(chroot "$root" python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
	mkdir -p "$root/usr/local/lib/$py/dist-packages"
	chroot "$root" su user -c "mkdir -p /home/user/.local/lib/$py/site-packages /home/user/.local/bin"
	leave
	;;
interpreter)
	lower=$1 upper=$2 ovl=$3
	shift 3
	mount -t overlay airlock-stock -o "lowerdir=$lower,upperdir=$upper,workdir=$ovl" "$root"
	apt=() npm=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do apt+=("$1"); shift; done
	[ $# -gt 0 ] && shift
	npm=("$@")
	enter
	apt_install "${apt[@]}"
	# Node's JavaScript and TypeScript kernels (tslab), from the npm
	# registry: its ZeroMQ binding ships its binaries in its package.
	# npm fetches as the host's does: with the host's CA bundle (a TLS
	# proxy's CA is the host's business, not the image's; the copy goes
	# with /tmp) and the registry the host's npm names.
	env=()
	if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
		cp -L /etc/ssl/certs/ca-certificates.crt "$root/tmp/host-ca.crt"
		env+=(NODE_EXTRA_CA_CERTS=/tmp/host-ca.crt npm_config_cafile=/tmp/host-ca.crt)
	fi
	if registry=$(npm config get registry 2>/dev/null) && [ -n "$registry" ]; then
		env+=("npm_config_registry=$registry")
	fi
	chroot "$root" env "${env[@]}" npm install -g --no-audit --no-fund --loglevel=error "${npm[@]}" >/dev/null
	patch_tslab "$root/usr/local/lib/node_modules/tslab/dist"
	for k in jslab:javascript:JavaScript tslab:typescript:TypeScript; do
		IFS=: read -r name lang display <<<"$k"
		js=""
		[ "$name" = jslab ] && js=', "--js"'
		mkdir -p "$root/usr/local/share/jupyter/kernels/$name"
		printf '{\n "argv": ["/usr/local/bin/tslab", "kernel", "--config-path", "{connection_file}"%s],\n "display_name": "%s",\n "language": "%s"\n}\n' \
			"$js" "$display" "$lang" > "$root/usr/local/share/jupyter/kernels/$name/kernel.json"
	done
	leave
	;;
*)
	echo "make.sh: unknown stage $stage" >&2
	exit 2
	;;
esac
