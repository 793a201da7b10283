from twisted.application.service import ServiceMaker

lockservice = ServiceMaker(
    "lockservice",
    "lockservice.tap",
    "A distributed lock service with FIFO queues and fencing tokens.",
    "lockservice",
)
