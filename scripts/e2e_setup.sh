#!/usr/bin/env bash
# Prepare the Spark end-to-end tier (tests/e2e): pinned pyspark, the Apache Uniffle Spark 3 client jar and
# the TPC-DS data generator. Idempotent: every step is skipped when its result is already there.
#
# Environment:
#   PYTHON                   interpreter to install into (default: python3; CI uses the system Python)
#   PYSPARK_VERSION          pinned pyspark (default 3.5.9; must stay 3.5.x: Scala 2.12, Spark 3 shuffle API)
#   UNIFFLE_CLIENT_VERSION   use exactly this client version (no fallback). Unset: try 0.10.0, then 0.9.2
#   RIFFLE_E2E_CACHE         jar cache folder (default: <repo>/.cache/spark-jars)
#   RIFFLE_E2E_SKIP_PIP=1    do not touch Python packages
#
# Output in the cache folder: rss-client-spark3-shaded-<v>.jar and uniffle-client.version (one line: <v>),
# which tests/e2e/conftest.py reads.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
PYSPARK_VERSION="${PYSPARK_VERSION:-3.5.9}"
DUCKDB_VERSION="${DUCKDB_VERSION:-1.5.5}"
CACHE="${RIFFLE_E2E_CACHE:-$REPO/.cache/spark-jars}"
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
UNIFFLE_GA="org.apache.uniffle:rss-client-spark3-shaded"

log() { printf '[e2e-setup] %s\n' "$*"; }
t0=$SECONDS
mkdir -p "$CACHE"

# ---------------------------------------------------------------- Python packages
installed_version() {  # $1 = distribution name
    "$PYTHON" - "$1" <<'EOF' 2>/dev/null || true
import sys
from importlib import metadata
try:
    print(metadata.version(sys.argv[1]))
except metadata.PackageNotFoundError:
    pass
EOF
}

pip_pin() {  # $1 = distribution, $2 = version
    local have
    have="$(installed_version "$1")"
    if [[ "$have" == "$2" ]]; then
        log "$1==$2 already installed (skipped)"
        return
    fi
    log "installing $1==$2 (found: ${have:-none})"
    local s=$SECONDS
    "$PYTHON" -m pip install --disable-pip-version-check -q "$1==$2"
    log "installed $1==$2 in $((SECONDS - s)) s"
}

if [[ "${RIFFLE_E2E_SKIP_PIP:-0}" != "1" ]]; then
    # pyspark 3.5.x is an sdist only (318 MB); pip builds a wheel (~25 s cold, ~3 s from pip's wheel cache).
    pip_pin pyspark "$PYSPARK_VERSION"
    # TPC-DS tier: DuckDB's dsdgen generates the 'tiny' (sf=0.01) data set and supplies the 99 query texts.
    # (The Kyuubi TPC-DS connector jar is not served by the registry reachable here.)
    pip_pin duckdb "$DUCKDB_VERSION"
    pip_pin duckdb-extension-tpcds "$DUCKDB_VERSION"
else
    log "RIFFLE_E2E_SKIP_PIP=1: Python packages untouched"
fi

# ---------------------------------------------------------------- status page and metrics tests
# Debian's chromium (tests/browser: the coordinator's status page in a headless browser) and
# prometheus-pushgateway (tests/ctl/test_metrics.py: the [metrics] push). Skipped when present.
status_page_pkgs=()
command -v chromium >/dev/null 2>&1 || status_page_pkgs+=(chromium)
command -v prometheus-pushgateway >/dev/null 2>&1 || status_page_pkgs+=(prometheus-pushgateway)
if (( ${#status_page_pkgs[@]} == 0 )); then
    log "chromium and prometheus-pushgateway already installed (skipped)"
elif command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    log "installing ${status_page_pkgs[*]} (Debian packages)"
    s=$SECONDS
    apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
    apt_install "${status_page_pkgs[@]}" || { apt-get update -qq >/dev/null && apt_install "${status_page_pkgs[@]}"; }
    log "installed ${status_page_pkgs[*]} in $((SECONDS - s)) s"
else
    log "WARNING: cannot install ${status_page_pkgs[*]} (needs root and apt-get); the browser and push tests will be skipped"
fi

# ---------------------------------------------------------------- Java / Maven
if ! command -v java >/dev/null 2>&1; then
    log "WARNING: java not found; the e2e tests will be skipped"
fi
if ! command -v mvn >/dev/null 2>&1; then
    log "WARNING: mvn not found; cannot fetch the Uniffle client jar (e2e tests will be skipped)"
    log "done in $((SECONDS - t0)) s"
    exit 0
fi

fetch_jar() {  # $1 = G:A:V ; returns mvn's status
    mvn -B -q "$DEP_PLUGIN:copy" -Dartifact="$1:jar" -DoutputDirectory="$CACHE" \
        -Dmdep.overWriteReleases=false >"$CACHE/mvn-last.log" 2>&1
}

uniffle_jar_for() { echo "$CACHE/rss-client-spark3-shaded-$1.jar"; }

recorded=""
[[ -f "$CACHE/uniffle-client.version" ]] && recorded="$(tr -d '[:space:]' <"$CACHE/uniffle-client.version")"

if [[ -n "${UNIFFLE_CLIENT_VERSION:-}" ]]; then
    candidates=("$UNIFFLE_CLIENT_VERSION")
else
    candidates=("0.10.0" "0.9.2")
fi

used=""
if [[ -n "$recorded" && -s "$(uniffle_jar_for "$recorded")" ]] \
        && { [[ -z "${UNIFFLE_CLIENT_VERSION:-}" ]] || [[ "$recorded" == "$UNIFFLE_CLIENT_VERSION" ]]; }; then
    used="$recorded"
    log "Uniffle client $used already in $CACHE (skipped)"
else
    for v in "${candidates[@]}"; do
        jar="$(uniffle_jar_for "$v")"
        if [[ -s "$jar" ]]; then
            used="$v"; log "Uniffle client $v already in $CACHE (skipped)"; break
        fi
        s=$SECONDS
        if fetch_jar "$UNIFFLE_GA:$v" && [[ -s "$jar" ]]; then
            used="$v"; log "fetched $UNIFFLE_GA:$v in $((SECONDS - s)) s"; break
        fi
        log "registry refused $UNIFFLE_GA:$v: $( { grep -oE 'Could not find artifact [^ ]+|was not found in [^ ]+|Unable to find/resolve artifact' "$CACHE/mvn-last.log" || tail -n1 "$CACHE/mvn-last.log"; } | head -n1)"
    done
fi

if [[ -z "$used" ]]; then
    log "ERROR: no Uniffle client jar could be fetched (tried: ${candidates[*]}); see $CACHE/mvn-last.log"
    exit 1
fi
echo "$used" >"$CACHE/uniffle-client.version"
log "Uniffle client version used: $used ($(uniffle_jar_for "$used"))"
rm -f "$CACHE/mvn-last.log"

# ---------------------------------------------------------------- HDFS tier: MiniDFSCluster (issue 12)
# Hadoop's MiniDFSCluster (a real NameNode + DataNodes in one JVM) for tests/integration/test_hdfs_tier.py,
# tests/fault/test_hdfs_faults.py and the Spark HDFS job: the jars of scripts/hdfs/pom.xml
# (hadoop-client-minicluster/-api/-runtime) into RIFFLE_HDFS_CACHE, and our launcher scripts/hdfs/MiniHdfs.java
# compiled there. tests/helpers/minihdfs.py starts it. Idempotent: skipped when the jars and an up-to-date
# class file are there. The server itself needs no JVM (hdfs-native, a Python dependency).
HDFS_CACHE="${RIFFLE_HDFS_CACHE:-$REPO/.cache/hdfs-jars}"
HADOOP_VERSION="${HADOOP_VERSION:-3.5.0}"
mkdir -p "$HDFS_CACHE"
if [[ -s "$HDFS_CACHE/hadoop-client-minicluster-$HADOOP_VERSION.jar" ]]; then
    log "MiniDFSCluster jars (Hadoop $HADOOP_VERSION) already in $HDFS_CACHE (skipped)"
else
    s=$SECONDS
    if mvn -B -q -f "$REPO/scripts/hdfs/pom.xml" "$DEP_PLUGIN:copy-dependencies" -Dhadoop.version="$HADOOP_VERSION" \
            -DincludeScope=runtime -DoutputDirectory="$HDFS_CACHE" >"$HDFS_CACHE/mvn-last.log" 2>&1; then
        log "fetched the MiniDFSCluster jars (Hadoop $HADOOP_VERSION) in $((SECONDS - s)) s"
        rm -f "$HDFS_CACHE/mvn-last.log"
    else
        log "ERROR: could not fetch hadoop-client-minicluster $HADOOP_VERSION; see $HDFS_CACHE/mvn-last.log"
        exit 1
    fi
fi
if command -v javac >/dev/null 2>&1; then
    if [[ ! -f "$HDFS_CACHE/classes/MiniHdfs.class" \
            || "$REPO/scripts/hdfs/MiniHdfs.java" -nt "$HDFS_CACHE/classes/MiniHdfs.class" ]]; then
        mkdir -p "$HDFS_CACHE/classes"
        javac -nowarn -cp "$HDFS_CACHE/*" -d "$HDFS_CACHE/classes" "$REPO/scripts/hdfs/MiniHdfs.java"
        log "compiled the MiniHdfs launcher into $HDFS_CACHE/classes"
    else
        log "MiniHdfs launcher up to date (skipped)"
    fi
else
    log "WARNING: javac not found; the HDFS tests will be skipped (CI: fail)"
fi

# ---------------------------------------------------------------- Kerberized HDFS: MiniKdc (issue 18)
# Hadoop's MiniKdc (a real KDC, Apache Kerby) for tests/integration/test_hdfs_kerberos.py: the jars of
# scripts/hdfs/minikdc-pom.xml (hadoop-minikdc, the same Hadoop version) into RIFFLE_KDC_CACHE, and our
# launcher scripts/hdfs/KerberizedMiniHdfs.java (MiniKdc + a Kerberized MiniDFSCluster) compiled there.
KDC_CACHE="${RIFFLE_KDC_CACHE:-$REPO/.cache/kdc-jars}"
mkdir -p "$KDC_CACHE"
if [[ -s "$KDC_CACHE/hadoop-minikdc-$HADOOP_VERSION.jar" ]]; then
    log "MiniKdc jars (Hadoop $HADOOP_VERSION) already in $KDC_CACHE (skipped)"
else
    s=$SECONDS
    if mvn -B -q -f "$REPO/scripts/hdfs/minikdc-pom.xml" "$DEP_PLUGIN:copy-dependencies" -Dhadoop.version="$HADOOP_VERSION" \
            -DincludeScope=runtime -DoutputDirectory="$KDC_CACHE" >"$KDC_CACHE/mvn-last.log" 2>&1; then
        log "fetched the MiniKdc jars (Hadoop $HADOOP_VERSION) in $((SECONDS - s)) s"
        rm -f "$KDC_CACHE/mvn-last.log"
    else
        log "ERROR: could not fetch hadoop-minikdc $HADOOP_VERSION; see $KDC_CACHE/mvn-last.log"
        exit 1
    fi
fi
if command -v javac >/dev/null 2>&1; then
    if [[ ! -f "$KDC_CACHE/classes/KerberizedMiniHdfs.class" \
            || "$REPO/scripts/hdfs/KerberizedMiniHdfs.java" -nt "$KDC_CACHE/classes/KerberizedMiniHdfs.class" ]]; then
        mkdir -p "$KDC_CACHE/classes"
        javac -nowarn -cp "$HDFS_CACHE/*:$KDC_CACHE/*" -d "$KDC_CACHE/classes" "$REPO/scripts/hdfs/KerberizedMiniHdfs.java"
        log "compiled the KerberizedMiniHdfs launcher into $KDC_CACHE/classes"
    else
        log "KerberizedMiniHdfs launcher up to date (skipped)"
    fi
fi

log "done in $((SECONDS - t0)) s"
