#!/usr/bin/env bash
# apt-text.sh OUT -- the text corpus of gvq-train --model text: one line per Debian package of
# the apt lists (run `apt-get update` first), "section<TAB>name one-line-description".
# apt-helper reads the lists whatever their compression (Debian 12 keeps them as .lz4).
set -euo pipefail
out=${1:?usage: apt-text.sh OUT}
shopt -s nullglob
lists=(/var/lib/apt/lists/*_Packages*)
[ ${#lists[@]} -gt 0 ] || { echo "apt-text: no package lists in /var/lib/apt/lists (run apt-get update)" >&2; exit 1; }
for f in "${lists[@]}"; do
    /usr/lib/apt/apt-helper cat-file "$f"
    echo
done | awk '/^Package:/ { p = $2 }
            /^Section:/ { s = $2 }
            /^Description:/ { sub(/^Description: */, ""); d = $0 }
            /^$/ { if (p != "" && s != "") print s "\t" p " " d; p = ""; s = ""; d = "" }' > "$out"
echo "apt-text: $(wc -l < "$out") packages in $out"
