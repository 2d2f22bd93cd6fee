#!/bin/sh
# Read-only probe of the NVIDIA user space in a container: prints tab-separated records
#   arch <arch>
#   pkg  <package> <version> <dpkg status>      (every NVIDIA package dpkg knows, plus dkms and cuda-drivers)
#   lib  <soname> <path> <resolved file> <owning package, empty when no dpkg package owns it>
# The libraries are listed in the order the loader finds them: ldconfig's cache, then the usual
# directories (a bind-mounted /usr/local/nvidia/lib64 from a container runtime included).
# dflash_infra/driver.py parses this output (parse_userspace_probe). POSIX sh: no bash in minimal images.
set -u
tab=$(printf '\t')

printf 'arch\t%s\n' "$(dpkg --print-architecture 2>/dev/null || uname -m)"

if command -v dpkg-query >/dev/null 2>&1; then
    # dpkg-query exits 1 when one of the patterns matches nothing; the other lines are still printed.
    dpkg-query -W -f='pkg\t${Package}\t${Version}\t${db:Status-Abbrev}\n' \
        '*nvidia*' 'dkms' 'cuda-drivers*' 2>/dev/null || true
fi

for soname in libnvidia-ml.so.1 libcuda.so.1; do
    {
        ldconfig -p 2>/dev/null | awk -v so="$soname" '$1 == so { print $NF }'
        for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia/lib64; do
            if [ -e "$dir/$soname" ]; then echo "$dir/$soname"; fi
        done
    } | awk '!seen[$0]++' | while IFS= read -r path; do
        resolved=$(readlink -f "$path")
        owner=$(dpkg-query -S "$resolved" 2>/dev/null | head -n 1 | cut -d: -f1 | cut -d, -f1) || owner=""
        printf 'lib%s%s%s%s%s%s%s%s\n' "$tab" "$soname" "$tab" "$path" "$tab" "$resolved" "$tab" "$owner"
    done
done
exit 0
