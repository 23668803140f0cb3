from valvey.cli import main

main()
