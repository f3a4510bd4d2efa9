# park call: one GGUF part
source .session/env.sh; python3 scripts/carry.py park .carry/$G 2>&1 | tail -1
