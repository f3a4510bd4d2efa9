# call B: GGUF part 1
set -x; source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -2; ls -la /tmp/carry/$G
