from trayagent.cli import main

main()
