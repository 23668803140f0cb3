from rlc.cli import main

main()
