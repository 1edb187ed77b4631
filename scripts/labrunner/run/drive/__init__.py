"""The lab's Python load driver: k6's contract for REST downloads (rest.js's environment, its summary), over
HTTP/1.1, HTTP/2 and HTTP/3; the runner starts it where it starts k6 for a target whose script is
scripts/drive_http.py (docs/http3.md)."""
