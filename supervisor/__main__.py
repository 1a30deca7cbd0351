from pulse.supervisor.main import main

main()
