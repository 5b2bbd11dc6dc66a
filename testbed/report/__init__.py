"""`lightpipe report`: one self-contained HTML page per run, reproduction or sweep directory."""
