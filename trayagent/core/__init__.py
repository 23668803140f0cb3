"""tray-agent's pure core: counter arithmetic, clock-event decoding, the cap state machine and
the contract payload. No I/O library, no clock (the caller passes monotonic and wall times)."""
