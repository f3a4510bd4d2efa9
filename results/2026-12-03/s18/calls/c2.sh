# s18 call 2: GGUF part 1 parked
source .session/env.sh; [ -f /tmp/s18.flag ] || { echo "no call-1 state on this machine: stopping"; exit 3; }
python3 scripts/carry.py park .carry/SmolLM2-135M-Instruct.Q4_1.gguf 2>&1 | tail -1; ls /tmp/carry/*
