from rackctl.cli import main

main()
