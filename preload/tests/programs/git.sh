# ci/preload.sh: git, run with and without LD_PRELOAD=libscalemem.so; the output must match.
# Fixed names, dates and no user config, so every hash is fixed.
export HOME=$PWD GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=ci GIT_AUTHOR_EMAIL=ci@example.com GIT_COMMITTER_NAME=ci GIT_COMMITTER_EMAIL=ci@example.com
export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'
git init -q -b main repo
cd repo
git config pack.threads 4
for i in $(seq 1 200); do
    f=src/f$((i % 40)).txt
    mkdir -p src
    seq "$i" $((i * 37)) | awk -v i="$i" '{ print "line", $1, $1 * i % 101 }' >"$f"
    printf 'commit %d\n' "$i" >>log.txt
    if ((i == 120)); then git checkout -q -b side HEAD~20; fi
    if ((i == 160)); then git checkout -q main; fi
    git add -A
    git commit -q -m "change $i"
done
git merge -q --no-ff -X theirs -m "merge side" side
git gc -q --aggressive --prune=now
git fsck --full --strict --no-progress
git rev-parse HEAD HEAD^{tree} side main~10
git log --format='%H %T %P %s' | sha256sum
git log --stat --format=%s main | sha256sum
git archive --format=tar HEAD | sha256sum
git count-objects -v | grep -E '^(count|in-pack|garbage)'
